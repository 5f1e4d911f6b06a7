"""The shell's I/O that the pure core is handed the results of: checkpoint and model stores (s3://, the hub, local
folders) read for the audit and the pods."""
