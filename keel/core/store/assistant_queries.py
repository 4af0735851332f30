"""The store's queries on the Agent Server's assistants of one's own and their versions (part
of `Store`, migration 0028).

An assistant's JSON fields (config, context, metadata) are passed and returned as JSON text.
"""

from __future__ import annotations

import json
from typing import Any

from keel.core.store.base import Connector, Row

MAX_ASSISTANTS = 10_000
"""The most assistants one search reads (its caller pages and sorts them)."""


class AssistantQueries:
    db: Connector

    async def create_assistant(
        self,
        assistant_id: str,
        *,
        graph_id: str,
        name: str,
        description: str | None,
        config: str,
        context: str,
        metadata: str,
    ) -> Row | None:
        """A new assistant at version 1 (kept as its first version); None if one of that id
        exists."""
        return await self._write_version(
            "insert_assistant",
            {
                "assistant_id": assistant_id,
                "graph_id": graph_id,
                "name": name,
                "description": description,
                "config": config,
                "context": context,
                "metadata": metadata,
            },
        )

    async def _write_version(self, query: str, fields: dict[str, Any]) -> Row | None:
        """`query` (an insert or an update of the assistant) and, if it wrote, the row it left
        kept as a version, in one transaction."""
        async with self.db.transaction() as tx:
            row = await tx.one(query, fields)
            if row is not None:
                await tx.execute("keep_assistant_version", {"assistant_id": fields["assistant_id"]})
            return row

    async def get_assistant(self, assistant_id: str) -> Row | None:
        async with self.db.read() as tx:
            return await tx.one("get_assistant", {"assistant_id": assistant_id})

    async def search_assistants(
        self, *, graph_id: str | None, metadata: dict[str, Any]
    ) -> list[Row]:
        """The assistants of `graph_id` (any if None) whose metadata holds `metadata`."""
        async with self.db.read() as tx:
            return await tx.all(
                "search_assistants",
                {"graph_id": graph_id, "metadata": json.dumps(metadata), "limit": MAX_ASSISTANTS},
            )

    async def update_assistant(
        self,
        assistant_id: str,
        *,
        graph_id: str | None,
        name: str | None,
        description: str | None,
        config: str | None,
        context: str | None,
        metadata: str | None,
    ) -> Row | None:
        """A new version of the assistant with the fields given (None: as they are; metadata is
        merged), in use at once; None if there is no such assistant."""
        return await self._write_version(
            "update_assistant",
            {
                "assistant_id": assistant_id,
                "graph_id": graph_id,
                "name": name,
                "description": description,
                "config": config,
                "context": context,
                "metadata": metadata,
            },
        )

    async def assistant_versions(
        self, assistant_id: str, *, metadata: dict[str, Any], limit: int, offset: int
    ) -> list[Row]:
        """The assistant's versions, newest first."""
        async with self.db.read() as tx:
            return await tx.all(
                "assistant_versions",
                {
                    "assistant_id": assistant_id,
                    "metadata": json.dumps(metadata),
                    "limit": limit,
                    "offset": offset,
                },
            )

    async def set_assistant_version(self, assistant_id: str, version: int) -> Row | None:
        """Put one of the assistant's versions in use; None if it has no such version."""
        async with self.db.transaction() as tx:
            return await tx.one(
                "set_assistant_version", {"assistant_id": assistant_id, "version": version}
            )

    async def delete_assistant(self, assistant_id: str) -> bool:
        """The assistant and its versions deleted; False if there was none."""
        async with self.db.transaction() as tx:
            await tx.execute("delete_assistant_versions", {"assistant_id": assistant_id})
            return await tx.one("delete_assistant", {"assistant_id": assistant_id}) is not None
