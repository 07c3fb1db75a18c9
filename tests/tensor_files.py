"""Test helper: read a safetensors folder's tensors as raw (dtype, shape, bytes), bypassing hf_io."""

from pathlib import Path

from safetensors import safe_open


def raw_tensors(folder: Path) -> dict[str, tuple[str, tuple, bytes]]:
    """name -> (dtype, shape, bytes) for every tensor of every `*.safetensors` file in `folder`."""
    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), framework="np") as handle:
            for name in handle.keys():
                t = handle.get_tensor(name)
                out[name] = (str(t.dtype), tuple(t.shape), t.tobytes())
    return out
