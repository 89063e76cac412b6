//! Harness for kace's end-to-end tests on a real local Slurm cluster (filled by the SPANK issue).
