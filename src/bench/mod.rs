//! Benchmark support: the BENCH.md workloads (the runner lives in the `memexec bench` CLI).
pub mod workloads;
