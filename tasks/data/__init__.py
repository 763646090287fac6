"""A corpus in: readers of files and records, splitting into passages with their lineage, ingest into the
canonical tables, and the generated sample."""
