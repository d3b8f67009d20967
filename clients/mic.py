"""Optional microphone input for ``dlr-client speech --mic`` (needs the ``sounddevice`` package).

Install with ``pip install 'dlr-serve-client[mic]'``; without it, ``--mic`` says so and exits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from clients.errors import ClientError

__all__ = ["microphone_chunks"]


def microphone_chunks(seconds: float, chunk_ms: float) -> tuple[int, AsyncIterator[np.ndarray]]:
    """Open the default input device; return (its sample rate, an async iterator of chunks)."""
    try:
        import sounddevice as sd
    except (ImportError, OSError) as exc:  # OSError: PortAudio library missing
        raise ClientError(
            "--mic needs the 'sounddevice' package and PortAudio "
            "(pip install 'dlr-serve-client[mic]')"
        ) from exc
    rate = int(sd.query_devices(kind="input")["default_samplerate"])
    block = max(1, int(rate * chunk_ms / 1000))

    async def chunks() -> AsyncIterator[np.ndarray]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[np.ndarray] = asyncio.Queue()

        def callback(indata: np.ndarray, frames: int, time_info: object, status: object) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, indata[:, 0].copy())  # (frames,) float32

        total = int(seconds * rate)
        sent = 0
        with sd.InputStream(
            samplerate=rate, channels=1, dtype="float32", blocksize=block, callback=callback
        ):
            while sent < total:
                piece = await queue.get()
                sent += len(piece)
                yield piece

    return rate, chunks()
