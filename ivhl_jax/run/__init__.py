"""Running things: the chunked driver with progress and resume, configs, output files, multi-process launch,
device report and compilation cache, the training profiler. Never imports physics or models."""
