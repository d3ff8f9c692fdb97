"""Engine lifecycle: argv and environment from config, the server process, log reading."""

from tuner.engine.argv import build_argv, build_env, flag_args, mask, mask_argv, secret_values
from tuner.engine.logparse import classify, parse_facts
from tuner.engine.process import Server, free_port, group_members

__all__ = [
    "Server",
    "build_argv",
    "build_env",
    "classify",
    "flag_args",
    "free_port",
    "group_members",
    "mask",
    "mask_argv",
    "parse_facts",
    "secret_values",
]
