"""Checkpointed DAG jobs (SPEC §8): documents, their compiler, and the runner.

A document names nodes, each running a task over the values of the nodes it
``needs``; each node's value is checkpointed as it completes, so an attempt
that re-claims a crashed job resumes instead of restarting. A resume reuses
only values nothing has moved under: the document's revision and shape, the
input's hash and the declared task versions are recorded with the
checkpoints, and a resume whose recorded values depend on something that
moved (their node's task or its version, an upstream node's, what they read,
the input) is :class:`RunMismatch`, naming what moved. No retry cures a
mismatch, so the attempt dead-letters the job at once
(``RunMismatch.retryable`` is False); ``requeue(id, drop_checkpoints=True)``
starts such a run over.

Runs are keyed per *attempt* (job id + the claim's token), never per job: a
stale attempt cannot write through the store of the attempt that replaced it.
"""

from jaren_jobs.dag.document import (
    RUN_IDENTITY_NODE,
    CompiledDag,
    Task,
    TaskContext,
    compile_document,
    document_revision,
)
from jaren_jobs.dag.runner import DagJobs, create_dag_job_runner

__all__ = [
    "RUN_IDENTITY_NODE",
    "CompiledDag",
    "DagJobs",
    "Task",
    "TaskContext",
    "compile_document",
    "create_dag_job_runner",
    "document_revision",
]
