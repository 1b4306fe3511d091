"""The data plane: the host runtime that lives in each Dask worker."""
