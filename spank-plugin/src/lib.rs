//! kace's SPANK plugin: a thin shell over Slurm's C hooks (filled by the SPANK issue).
