"""hat-jax: Harness-Aware Training in JAX/Flax."""
