-- Up Migration
-- The system prompt a session was composed with, written once at its first turn (a fork's is its parent's):
-- later turns, continuations and recovered turns reuse the same bytes instead of composing again.
alter table sessions add column system_prompt text;

-- Down Migration
alter table sessions drop column system_prompt;
