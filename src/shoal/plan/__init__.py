"""Capacity planning: predict a job's epoch and job time on any cluster before booking the machines."""
