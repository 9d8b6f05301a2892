"""Rollouts: a canary judged against stable, the observations it is judged on, and shadow copies."""
