"""Helpers of tools/setup_env.sh that run before the stack is installed (standard library only)."""
