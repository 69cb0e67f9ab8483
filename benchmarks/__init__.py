"""Runnable benchmarks; each module with run(out_dir, quick) -> dict is one benchmark."""
