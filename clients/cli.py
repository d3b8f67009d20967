"""``dlr-client``: command line for dlr-serve.

Commands::

    dlr-client speech FILE... [--realtime] [--chunk-ms 100] [--json] [--model M]
    dlr-client speech --mic [--seconds 5]          # needs the optional 'sounddevice' package
    dlr-client speech --continuous FILE|--mic [--threshold T] [--keywords stop=0.8,go=0.6]
                      [--listen stop,go] [--refractory-ms MS]   # one line per detected command
    dlr-client generate "prompt" [--max-new-tokens 64 --temperature 0.8 --top-k --top-p --seed --stop S]
    dlr-client chat [--model M]                     # interactive; state stays on the server
    dlr-client models [--json]

The server address comes from ``--url`` or ``DLR_URL`` (default http://127.0.0.1:8000), the API
key from ``--api-key`` or ``DLR_API_KEY``. Exit status: 0 ok, 1 a server or connection error
(printed as ``error: [code] message``), 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from clients.chat import AsyncChatSession
from clients.errors import ClientError
from clients.generate import AsyncGenerateClient
from clients.speech import AsyncSpeechClient
from clients.types import Detection, SpeechResult

__all__ = ["build_parser", "main"]


def _conn_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "api_key": args.api_key,
        "connect_timeout": args.connect_timeout,
        "read_timeout": args.read_timeout,
    }


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "stop": args.stop or None,
    }


def _keywords(text: str | None) -> dict[str, float] | None:
    """``stop=0.8,go=0.6`` -> {"stop": 0.8, "go": 0.6}."""
    if not text:
        return None
    out = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"dlr-client speech: --keywords wants NAME=THRESHOLD, got {item!r}")
        out[name.strip()] = float(value)
    return out


def _listening(args: argparse.Namespace) -> dict[str, Any]:
    if not args.continuous:
        return {}
    listen = [w.strip() for w in args.listen.split(",") if w.strip()] if args.listen else None
    return {
        "continuous": True,
        "threshold": args.threshold,
        "keywords": _keywords(args.keywords),
        "listen": listen,
        "refractory_ms": args.refractory_ms,
    }


def _fmt_detection(d: Detection) -> str:
    return f"{d.end_ms / 1000:8.2f}s  {d.label:<10} {d.score:.3f}  (from {d.start_ms / 1000:.2f}s)"


def _fmt(r: SpeechResult) -> str:
    top = ", ".join(f"{t.label}={t.score:.3f}" for t in r.top[:3])
    return f"{r.audio_ms / 1000:7.2f}s  {r.label:<10} {r.score:.3f}  [{top}]"


async def _speech(args: argparse.Namespace, out: TextIO) -> int:
    if args.mic:
        from clients.mic import microphone_chunks

        sources = [("microphone", None)]
    else:
        if not args.files:
            raise SystemExit("dlr-client speech: give one or more FILEs, or --mic")
        sources = [(f, f) for f in args.files]
    live = out.isatty() and not args.json
    async with AsyncSpeechClient(args.url, model=args.model, **_conn_kwargs(args)) as client:
        for name, path in sources:
            opts = _listening(args)
            if path is None:
                rate, chunks = microphone_chunks(args.seconds, args.chunk_ms)
                stream = client.stream(chunks, sample_rate=rate, realtime=False, **opts)
            else:
                stream = client.stream_file(
                    path,
                    chunk_ms=args.chunk_ms,
                    realtime=args.realtime,
                    interim_results=not args.final_only and (live or not args.continuous),
                    **opts,
                )
            async for r in stream:
                if isinstance(r, Detection):
                    if args.json:
                        out.write(json.dumps({"file": name, **r.to_dict()}) + "\n")
                    else:
                        out.write(("\r\033[K" if live else "") + f"{name}: {_fmt_detection(r)}\n")
                elif args.continuous and r.is_final and not args.json:
                    n = len(r.detections)
                    out.write(f"{name}: {n} detection(s) in {r.audio_ms / 1000:.2f}s\n")
                elif args.continuous and not r.is_final and not args.json:
                    if live:
                        out.write(f"\r\033[K{name}: {r.vad or ''} {_fmt(r)}")
                elif args.json:
                    out.write(json.dumps({"file": name, **r.to_dict()}) + "\n")
                elif r.is_final:
                    out.write(("\r\033[K" if live else "") + f"{name}: {r.label} {r.score:.3f}\n")
                elif live:
                    out.write(f"\r\033[K{name}: {_fmt(r)}")
                else:
                    out.write(f"{name}: partial {_fmt(r)}\n")
                out.flush()
    return 0


async def _generate(args: argparse.Namespace, out: TextIO) -> int:
    async with AsyncGenerateClient(args.url, model=args.model, **_conn_kwargs(args)) as client:
        if args.no_stream:
            res = await client.generate(args.prompt, **_sampling(args))
            if args.json:
                usage = res.usage.__dict__ if res.usage else None
                out.write(
                    json.dumps(
                        {"text": res.text, "finish_reason": res.finish_reason, "usage": usage}
                    )
                    + "\n"
                )
            else:
                out.write(res.text + "\n")
            return 0
        last = None
        async for ev in client.generate_stream(args.prompt, **_sampling(args)):
            if args.json:
                out.write(json.dumps(ev.raw) + "\n")
            else:
                out.write(ev.text)
            out.flush()
            last = ev
        if not args.json:
            out.write("\n")
            if last is not None and last.finish_reason:
                usage = f", {last.usage.completion_tokens} tokens" if last.usage else ""
                sys.stderr.write(f"[finish: {last.finish_reason}{usage}]\n")
    return 0


async def _chat(args: argparse.Namespace, out: TextIO, inp: TextIO) -> int:
    async with AsyncChatSession(args.url, model=args.model, **_conn_kwargs(args)) as chat:
        interactive = inp.isatty()
        if interactive:
            sys.stderr.write(f"session {chat.session_id}; empty line or /quit to leave\n")
        loop = asyncio.get_running_loop()
        while True:
            if interactive:
                sys.stderr.write("> ")
                sys.stderr.flush()
            line = await loop.run_in_executor(None, inp.readline)
            if not line or line.strip() in ("", "/quit", "/exit"):
                return 0
            await chat.append(args.prefix + line.rstrip("\n") + args.suffix)
            async for ev in chat.generate(**_sampling(args)):
                out.write(ev.text)
                out.flush()
            out.write("\n")
            out.flush()


async def _models(args: argparse.Namespace, out: TextIO) -> int:
    async with AsyncGenerateClient(args.url, **_conn_kwargs(args)) as client:
        models = await client.models()
    if args.json:
        out.write(json.dumps([m.raw for m in models], indent=2) + "\n")
        return 0
    for m in models:
        extra = f"labels: {', '.join(m.labels)}" if m.labels else ""
        if m.vocab_size:
            extra = f"vocab: {m.vocab_size}"
        rate = f" @ {m.sample_rate} Hz" if m.sample_rate and m.kind != "lm" else ""
        state = f" state {m.state_bytes_per_session} B" if m.state_bytes_per_session else ""
        out.write(f"{m.name}  [{m.kind}{rate}{state}]  {extra}\n")
    return 0


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlr-client", description="Client of a dlr-serve server.")
    p.add_argument("--url", default=os.environ.get("DLR_URL", "http://127.0.0.1:8000"))
    p.add_argument("--api-key", default=os.environ.get("DLR_API_KEY") or None)
    p.add_argument("--connect-timeout", type=float, default=10.0)
    p.add_argument("--read-timeout", type=float, default=60.0)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("speech", help="classify audio files (or the microphone) as they stream")
    s.add_argument("files", nargs="*", help="WAV/FLAC files")
    s.add_argument("--model", default=None)
    s.add_argument("--realtime", action="store_true", help="send at the audio's real speed")
    s.add_argument("--chunk-ms", type=float, default=100.0, help="audio per message (ms)")
    s.add_argument("--json", action="store_true", help="one JSON object per result line")
    s.add_argument("--final-only", action="store_true", help="ask for no partial results")
    s.add_argument("--mic", action="store_true", help="record from the microphone (sounddevice)")
    s.add_argument("--seconds", type=float, default=5.0, help="microphone recording length")
    s.add_argument(
        "--continuous", action="store_true", help="keyword spotting: one line per command"
    )
    s.add_argument("--threshold", type=float, default=None, help="detection threshold (0, 1]")
    s.add_argument("--keywords", default=None, help="per-command thresholds: stop=0.8,go=0.6")
    s.add_argument("--listen", default=None, help="only these commands: stop,go")
    s.add_argument("--refractory-ms", type=float, default=None, help="quiet time after a hit")

    g = sub.add_parser("generate", help="generate text, streamed to the terminal")
    g.add_argument("prompt")
    g.add_argument("--model", default=None)
    g.add_argument("--no-stream", action="store_true", help="wait and print the whole text")
    g.add_argument("--json", action="store_true")
    _add_sampling(g)

    c = sub.add_parser("chat", help="interactive session whose state stays on the server")
    c.add_argument("--model", default=None)
    c.add_argument("--prefix", default="", help="text put before each of your lines")
    c.add_argument("--suffix", default="\n", help="text put after each of your lines")
    _add_sampling(c)

    m = sub.add_parser("models", help="list the served models")
    m.add_argument("--json", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = sys.stdout
    try:
        if args.command == "speech":
            return asyncio.run(_speech(args, out))
        if args.command == "generate":
            return asyncio.run(_generate(args, out))
        if args.command == "chat":
            return asyncio.run(_chat(args, out, sys.stdin))
        return asyncio.run(_models(args, out))
    except ClientError as exc:
        out.flush()
        sys.stderr.write(f"\nerror: {exc}\n")
        return 1
    except ValueError as exc:  # unreadable audio file, bad parameter
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
