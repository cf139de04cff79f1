"""Errors of `tightfit export`: each is one line for the user (the CLI prints it, exit status 2)."""
from __future__ import annotations

from tightfit.errors import TightfitError


class ExportError(TightfitError):
    """The plan cannot be exported, built or run as C (bad input, failed build, failed run)."""


class ToolchainMissingError(ExportError):
    """A compiler, library or emulator the export needs is not installed."""


class DoesNotFitError(ExportError):
    """The built program is larger than the device's RAM or flash; says by how much and why."""

    def __init__(self, message: str, ram_overflow: int = 0, flash_overflow: int = 0):
        super().__init__(message)
        self.ram_overflow, self.flash_overflow = ram_overflow, flash_overflow
