"""Imported only by engine.preload's zygote in the hung-fork test: its presence in
``sys.modules`` tells ``helpers.hang_when_forked`` that it runs as a fork."""
