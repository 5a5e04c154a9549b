"""Result artifacts: schema, validation, provenance capture, loading and rendering.

Every figure the site shows comes from one of these files under ``results/``.
"""

from .schema import ORIGINS, SCHEMA_VERSION, Artifact, ArtifactError, Column, load_file, validate
from .store import RESULTS_DIR_ENV, default_results_dir, load, load_all, published_results_dir, write
from .render import caption, format_cell, markdown_table, to_frame

__all__ = [
    "ORIGINS", "SCHEMA_VERSION", "Artifact", "ArtifactError", "Column", "RESULTS_DIR_ENV",
    "caption", "default_results_dir", "format_cell", "load", "load_all", "load_file",
    "markdown_table", "published_results_dir", "to_frame", "validate", "write",
]
