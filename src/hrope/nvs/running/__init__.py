"""Running a training: the loop and its step, checkpoints, run folders, locks, atomic files and data parallelism."""
