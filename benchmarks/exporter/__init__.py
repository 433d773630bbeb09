"""The exporter's scrape time and resident memory against bare prometheus_client exposition."""
