"""DCT-MP's wire format for the pooled-embedding all-to-all, shared by the comm benchmark and DLRM training."""
