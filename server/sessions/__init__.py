"""Session logic, below the routes and above the scheduler.

- `store.py`: live WebSocket sessions (ids, resume tokens, outbox, detach/attach, grace),
  slot ownership (`owned_slot`), the `SessionStore` and its `StoreDep`;
- `connection.py`: the one WebSocket handler skeleton (admission, start, resume, ends);
- `speech.py` / `text.py`: the session kinds (and the HTTP generation run);
- `kinds.py`: the kind table the routes and `restore.py` use;
- `restore.py`: a session rebuilt from a state blob (import, drain files).
"""
