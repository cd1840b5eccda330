"""Benchmarks of a model's code: extract code from outputs, parse it, check the task, pass@k, gates.

The checking half (bench, extract, checks, passk, gates) imports no torch; generation does.
"""
