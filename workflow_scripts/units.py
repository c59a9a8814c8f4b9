"""Byte units, written once. Memory is reported in GiB (2^30: what the allocators and the GPU's capacity use);
rates and message sizes are decimal (MB = 10^6, GB = 10^9: bandwidths, calibration, nccl-tests' convention);
MiB (2^20) where an API reports it."""
MIB = 2**20
GIB = 2**30
MB = 10**6
GB = 10**9
