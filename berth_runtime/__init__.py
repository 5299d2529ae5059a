"""The runtime inside a berth job: standard library only, on the job's PYTHONPATH.

    from berth_runtime import emit, save_artifact, load_artifact
    emit(loss=0.5, step=10)              # numbers kept per job (`berth job show --json`)
    ref = save_artifact("model.pt")      # into the artifact store, for this job's tenant
    load_artifact(ref, "model.pt")       # a blob this job's tenant holds, into a file
    if request_approval("deploy v2", "to prod"):  # blocks until a person answers
        ...

Each call goes to the job's worker over a socket in the job's own folder, with a secret of
this lease; the worker acts while the lease is live and refuses once it ended. This package
imports nothing else of berth (an import contract keeps it so): it must load in any Python the
job brings.
"""

from berth_runtime.relay import RelayError, emit, load_artifact, request_approval, save_artifact

__all__ = ["RelayError", "emit", "load_artifact", "request_approval", "save_artifact"]
