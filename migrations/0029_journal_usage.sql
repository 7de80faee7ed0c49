-- Up Migration
-- The provider usage of the response an assistant row records (tokens in, out, read from and written to the
-- prompt cache, cost when the model's prices are known), kept beside the row's original JSON, never inside it:
-- transcripts and provider request prefixes stay byte-identical. Null when the response reported no usage
-- (the offline scripted provider, a refused request, rows written before this migration) and on every row a
-- fork copied from its parent (inherited context is not the fork's response). Additive.
alter table journal_entries add column provider_usage jsonb
  check (provider_usage is null or (role = 'assistant' and jsonb_typeof(provider_usage) = 'object'));

-- Down Migration
alter table journal_entries drop column provider_usage;
