"""Library warnings a DistFlow user cannot act on, silenced in every rank before the libraries load.

Each entry names why it is noise here. Anything else a library warns about still reaches the console.
"""

import re
import warnings

# message (start of the warning text) -> why it says nothing actionable
EXPECTED_WARNINGS = {
    "Transformer Engine and Apex are not installed": "Megatron-Core at import where the optional GPU extras are absent (always on CPU): it falls back to torch",
    "Apex is not installed": "the same, for Megatron-Core's norm layers",
    "full scope is deprecated": "Megatron-Core 0.16.1 warns about its own default cuda_graph_scope, which DistFlow never sets",
}
# Only on machines without CUDA: there is no device connection to configure (GPU launch scripts set it).
CPU_ONLY_WARNINGS = {
    "When using async grad allreduce it is recommended to set the environment variable CUDA_DEVICE_MAX_CONNECTIONS": "Megatron-Core's advice for CUDA streams, meaningless on CPU",
}


def silence_library_noise(cuda: bool) -> None:
    """Installs the warning filters of this process (call once, early, in each rank)."""
    messages = list(EXPECTED_WARNINGS) + ([] if cuda else list(CPU_ONLY_WARNINGS))
    for message in messages:
        warnings.filterwarnings("ignore", message=re.escape(message))
