"""The base layer: what every package of the suite may import, and which imports none of them.

config (the typed experiment config), types, interfaces (the selector and allocator protocols),
registry (names to classes), io (atomic writes), distributed (process groups), runtime (seeding,
peak memory), log (logging and progress), data, prompts and models (pools and checkpoints),
results (the results store), rundir (a run folder's layout, lock and stage markers),
fingerprints, memory (the GPU memory plan), optim and sharding (training building blocks).

Nothing here imports method/, baselines/, evals/, reports/, slurm/ or the application modules
of repro/ (pipeline, trainer, cli, ...); tests/test_layers.py enforces it.
"""
