"""The effects wing: every side effect a run causes happens once.

Two ways to run an effect, one set of rules:

- the ledger (`ledger`, its rows in `rows`): the node calls the provider itself, under a key
  reserved before the call and recorded after it; a key a crash left pending is settled by
  `in_doubt`;
- the effect outbox (`outbox`; `dispatch` claims its intents, `delivery` delivers one): the
  node stages an intent with its step's writes, and a dispatcher delivers it later under the
  intent's id.

Both kinds are declared by one decorator (`declare`: `keel.effect`) and carry one
`options.EffectOptions`. `keys` names a call by its place in the run; `calls` bounds a
provider call by its deadline. Notifications about waits have an outbox of their own
(`keel.core.notification_outbox`); its rows are notifications, the effect outbox's intents.
"""
