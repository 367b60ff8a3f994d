"""The run's lifecycle: ``repro up`` attached (``attached``; its matrix of repeats, ``matrix``), detached
(``detached``: submit, status, adopt), what both share before a cell runs (``start``) and their finish
(``finishing``: the provenance sealed, the judgement, the reports, the archive)."""

from repro.up.attached import up
from repro.up.detached import adopt, image_failure, is_detached, status_text, submit, view
from repro.up.finishing import findings_section, finish, write_reports
from repro.up.start import Interrupted, UpOptions, UpResult

__all__ = ["Interrupted", "UpOptions", "UpResult", "adopt", "findings_section", "finish", "image_failure",
           "is_detached", "status_text", "submit", "up", "view", "write_reports"]
