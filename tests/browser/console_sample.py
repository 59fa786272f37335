"""What the console's browser tests replay and where they keep their screenshots."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "infra/samples/swe-agent__marshmallow-1867_function_calling_replace_from_source.jsonl"
SHOTS = ROOT / "out" / "console"
VIEWPORT = {"width": 1280, "height": 900}
# Small enough that the sample's history is compacted, large enough for its system prompt and task.
BUDGET = 6_000
# Record content is untrusted: it must show as text, never run or render as markup.
HOSTILE = "<b>bold?</b><script>window.__pwned = 1</script> & <img src=x onerror=window.__pwned=2>"
