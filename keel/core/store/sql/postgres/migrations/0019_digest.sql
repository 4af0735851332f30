-- Ids derived in SQL (a decision's and a registration's notification intents, issue 12) by the
-- same rule as keel.core.ids.digest: sha256 over length-prefixed parts, in hex. SQLite's
-- `keel_digest` is that Python function, registered on each connection.
CREATE OR REPLACE FUNCTION keel_digest(VARIADIC parts TEXT[]) RETURNS TEXT
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT encode(sha256(string_agg(int8send(octet_length(p)::BIGINT) || convert_to(p, 'UTF8'),
                                    ''::BYTEA ORDER BY i)), 'hex')
    FROM unnest(parts) WITH ORDINALITY AS u (p, i)
$$;
