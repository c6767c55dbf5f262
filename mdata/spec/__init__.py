"""Plans as data: the declarative spec a Plan turns into, for the wire and for plan files.

- :mod:`mdata.spec.refs` — references to importable objects (transforms, cost models, policies)
  and who may import them (:class:`Trust`; the scheduler's rule is :func:`scheduler_trust`);
- :mod:`mdata.spec.worker_trust` — what a loader worker agrees to build and open for a plan
  (:func:`~mdata.spec.worker_trust.worker_trust`: transforms, URL protocols, storage options);
- :mod:`mdata.spec.sources` — :class:`SourceSpec`, a source as plain data;
- :mod:`mdata.spec.plan_spec` — ``Plan <-> dict`` (``Plan.to_spec()`` / ``Plan.from_spec()``);
- :mod:`mdata.spec.files` — the same spec as a YAML or JSON file;
- :mod:`mdata.spec.plan_paths` — what is relative in a plan file: relative urls are read from its
  folder, a module it names beside it imports;
- :mod:`mdata.spec.version` — the schema version.

The schema and the import rule are documented in docs/plan-files.md.
"""

from mdata.spec.files import read_spec, write_spec
from mdata.spec.plan_spec import SPEC_KEYS, plan_from_spec, plan_to_spec
from mdata.spec.refs import BUILTIN_REFERENCES, Trust, scheduler_trust
from mdata.spec.sources import SourceSpec, source_spec
from mdata.spec.version import SCHEMA_KEY, SCHEMA_VERSION

__all__ = [
    "BUILTIN_REFERENCES", "SCHEMA_KEY", "SCHEMA_VERSION", "SPEC_KEYS", "SourceSpec", "Trust",
    "plan_from_spec", "plan_to_spec", "read_spec", "scheduler_trust", "source_spec", "write_spec",
]
