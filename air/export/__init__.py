"""Exports of air episodes into other tools' formats (`air export ...`)."""

from air.export.sft import ExportOptions, ExportResult, export_sft_files, sft_rows

__all__ = ["ExportOptions", "ExportResult", "export_sft_files", "sft_rows"]
