"""Evaluation: the live-stream suites, IFEval and the in-domain ifeval_mini (see `hat_jax.eval.runner`)."""

from hat_jax.eval.runner import EvalConfig, evaluate, evaluate_checkpoint

__all__ = ["EvalConfig", "evaluate", "evaluate_checkpoint"]
