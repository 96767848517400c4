"""Datasets: the folder format, importers, the partition plan, the per-worker loader, synthetic data."""

from shoal.data.format import Dataset, DatasetWriter, open_dataset

__all__ = ["Dataset", "DatasetWriter", "open_dataset"]
