"""The command-line programs (console scripts ``loire-*``; ``launch/*.py`` in a checkout).

Each module is a thin edge: parse arguments, set up devices, call the library, map the
outcome to one line and an exit code. Nothing here is imported by the library itself.

May import: everything (it is the top layer).
"""
