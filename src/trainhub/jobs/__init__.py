"""Scripts trainhub runs as ordinary trials on the cluster (``python -m trainhub.jobs.NAME``)."""
