"""`mens dogfood`: corpus -> held-out bench -> base eval -> train -> tuned eval -> gate -> merge -> card."""

from mens.dogfood.pipeline import DogfoodConfig, run_dogfood

__all__ = ["DogfoodConfig", "run_dogfood"]
