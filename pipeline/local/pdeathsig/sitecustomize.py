# Imported by every Python interpreter started with this folder on PYTHONPATH: the local vLLM server
# and the processes it spawns (EngineCore, Worker, resource tracker). Each asks the kernel for SIGTERM
# when its parent dies, so no part of the server outlives the pipeline, even after kill -9. Linux only.
import os

_expected_parent = os.environ.get("PIPELINE_PDEATHSIG_PARENT")
if _expected_parent:
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    else:
        if os.getppid() != int(_expected_parent):
            os._exit(1)  # the parent died before we could watch it
    os.environ["PIPELINE_PDEATHSIG_PARENT"] = str(os.getpid())  # for our own children
