"""Compile-only checks for TPU pod slices, runnable on a CPU with libtpu (`python -m hat_jax.aot`).

`topology` names slices and builds meshes over their devices, `programs` builds each stage's jitted
programs with abstract inputs at the stage's shapes, `report` compiles them and reads per-chip memory,
FLOPs and collectives. Needs the `tpu-aot` extra (libtpu).
"""
