"""Run: python -m mens ..."""

from mens.cli.main import main

main()
