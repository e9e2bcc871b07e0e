"""``python -m streamkit`` runs the command line."""

from ._cli import main

main()
