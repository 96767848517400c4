"""Scaling studies: training time against dataset size and cluster size, their statistics and plots."""
