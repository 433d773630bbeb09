"""Certificates for gpupack: a CA and the serving and client certificates it issues."""
