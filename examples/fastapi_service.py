"""A small FastAPI service: one request per turn, one run_code tool shared by every request.

Serve it:        uvicorn examples.fastapi_service:app        (pip install uvicorn)
Try it offline:  python examples/fastapi_service.py           (drives the app in-process with its TestClient)

Needs: pip install 'snapcell[examples]'
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

import snapcell

STORE = os.environ.get("SNAPCELL_STORE", "file://.snapcell")  # s3://bucket/prefix for several servers


def exchange_rate(currency: str) -> float:
    """Euros per unit of the currency."""
    return {"USD": 0.92, "GBP": 1.17}[currency]  # your application's code


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # One pool and one tool for the life of the process: opening a pool per request would start a worker
    # process each time (about 200 ms); a warm pool hands out a ready one.
    async with snapcell.AsyncPool(STORE, create_store=True) as pool:
        app.state.tool = snapcell.CodeTool(pool, tools={"exchange_rate": exchange_rate})
        yield
        await app.state.tool.aclose()


app = FastAPI(lifespan=lifespan)


class Answer(BaseModel):
    conversation_id: str
    answer: str


@app.post("/conversations/{conversation_id}/turns")
async def run_turn(conversation_id: str, turn: snapcell.tool.RunCodeArguments, request: Request) -> Answer:
    """Run one turn of a conversation; the answer is the text for the model.

    The request body is the run_code tool's own arguments model: the schema a model is given is the one checked here.
    """
    tool: snapcell.CodeTool = request.app.state.tool
    try:
        text = await tool.run_code(conversation_id, turn.code, turn.setup)
    except snapcell.errors.InvalidKey as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from exc
    except snapcell.Conflict as exc:  # another turn of this conversation is running
        raise HTTPException(status_code=409, detail=str(exc)) from exc
    return Answer(conversation_id=conversation_id, answer=text)


@app.get("/conversations/{conversation_id}")
async def current_checkpoint(conversation_id: str, request: Request) -> dict[str, str | None]:
    """The conversation's current checkpoint ID (hex), for `snapcell inspect`."""
    head = await request.app.state.tool.head(conversation_id)
    return {"checkpoint_id": head.checkpoint_id.hex() if head and head.checkpoint_id else None}


if __name__ == "__main__":
    from fastapi.testclient import TestClient

    with TestClient(app) as client:
        for code in ("prices = {'USD': 40, 'GBP': 25}", "sum(p * exchange_rate(c) for c, p in prices.items())"):
            reply = client.post("/conversations/shop-7/turns", json={"code": code})
            print(reply.json()["answer"])
        print(client.get("/conversations/shop-7").json())
