"""Primus-Turbo: high-performance training operators for AMD Instinct GPUs."""

try:
    from primus_turbo._version import __version__, git_commit
except ImportError:  # source tree without a build step
    __version__ = "0.0.0+unknown"
    git_commit = "unknown"

__all__ = ["__version__", "git_commit"]
