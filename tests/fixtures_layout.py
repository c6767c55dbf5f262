"""An image-heavy plan for the pool layout tests: native-size photographs beside short text."""

from __future__ import annotations

from fixtures_sources import Store, encode_image, grace_hopper, stdlib_texts, write_parquet

__all__ = ["image_heavy_plan", "rate_for"]

IMAGE_TOKEN_ID = 100_300


def image_heavy_plan(root):
    """Native-size photographs (4 MPix JPEGs, the matplotlib sample photo upscaled) beside two
    short text sources; half of every batch is photographs."""
    from PIL import Image

    from mdata.cost import AttentionCost
    from mdata.mesh import ClientPlaceTree
    from mdata.plan import Plan
    from mdata.sources import DecodeImageCaption, Source, TokenizeText

    store = Store("local", str(root))
    big = grace_hopper().resize((2048, 2048), Image.Resampling.BICUBIC)
    photo = encode_image(big, "JPEG", quality=90)
    texts = stdlib_texts(48, max_chars=300)
    write_parquet(store, "photos/part-0.parquet", {"image": [photo] * 8, "caption": texts[:8]}, row_group_size=2)
    write_parquet(store, "notes/part-0.parquet", {"text": texts})
    write_parquet(store, "code/part-0.parquet", {"body": texts[::-1]})
    sources = [Source("photos", store.url("photos"), chunk_rows=2, transform=DecodeImageCaption()),
               Source("notes", store.url("notes"), chunk_rows=16, transform=TokenizeText()),
               Source("code", store.url("code"), chunk_rows=16, transform=TokenizeText(field="body"))]
    return (Plan(sources).mix({"photos": 2.0, "notes": 1.0, "code": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=4096, global_batch=8).distribute(ClientPlaceTree(dp=1))
            .special_tokens(image_token_id=IMAGE_TOKEN_ID).seed(1))


def rate_for(profile, plan, busy_threads: float) -> float:
    """The step rate at which the photos need ``busy_threads`` threads, headroom included."""
    weight = 2.0 / 4.0
    return busy_threads / (1.25 * weight * plan.balance_spec.global_batch * profile["photos"].cost())
