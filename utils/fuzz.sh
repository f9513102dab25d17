#!/usr/bin/env bash
# Builds libFuzzer targets with clang-22 (ASan + UBSan) in their own
# folder and fuzzes each for a bounded time from its corpus:
#   - the GGUF reader (the malformed-GGUF corpus replayed once first);
#   - the .kiln artifact reader, seeded with artifacts kiln-compile makes
#     (when the main build exists);
#   - the chat-template parser and renderer (a GGUF file's template is
#     untrusted input), seeded with Kiln's GLM template;
#   - the reply constraints of a request's JSON schema (SchemaPrefix, alone
#     and behind ThinkFirst; accepts checked against push);
#   - the GGUF tokenizer (a vocabulary, merges and special ids, then text
#     encoded both ways: ids valid, decoded back to the text, streamed as
#     decoded);
#   - a reply's markup (tool calls and the thinking block, whole against
#     streamed; every call's arguments a JSON object);
#   - forced tool calls (tool_choice "required" or named: what the call
#     constraint takes as complete must read back as the calls it allowed).
# Exits non-zero on any crash, sanitizer report, timeout, out-of-memory or
# disagreement.
#
# usage: utils/fuzz.sh [--seconds N] [--junit FILE]
#   --seconds N   fuzzing time (default: $KILN_FUZZ_SECONDS or 30)
#   --junit FILE  also write a JUnit XML report (for utils/test.sh)
# KILN_FUZZ_BUILD_DIR overrides the build folder (default build-fuzz).
# A crashing input is kept in <build folder>/artifacts/ to replay:
#   build-fuzz/gguf-reader-fuzzer build-fuzz/artifacts/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${KILN_FUZZ_SECONDS:-30}
junit=""
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --junit) junit=$2; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "fuzz: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

build=${KILN_FUZZ_BUILD_DIR:-build-fuzz}
cxx=${KILN_FUZZ_CXX:-clang++-22}
bin="$build/gguf-reader-fuzzer"
sources=(test/fuzz/GGUFReaderFuzzer.cpp utils/gguf/GGUFFile.cpp
  utils/gguf/GGUFValue.cpp utils/quant/QuantTypes.cpp utils/support/Error.cpp)
corpus_src=test/gguf-corpus

# JUnit XML: one test case per step, failed when the step's status is not 0.
write_junit() {
  [ -n "$junit" ] || return 0
  local replay=$1 fuzz=$2 artifact=${3:-skip} chat=${4:-skip} schema=${5:-skip}
  local tokenizer=${6:-skip} reply=${7:-skip} toolcall=${8:-skip}
  local failures=0 case
  {
    echo '<?xml version="1.0" encoding="utf-8"?>'
    [ "$replay" = 0 ] || failures=$((failures + 1))
    [ "$fuzz" = 0 ] || failures=$((failures + 1))
    case $artifact in 0|skip) ;; *) failures=$((failures + 1)) ;; esac
    case $chat in 0|skip) ;; *) failures=$((failures + 1)) ;; esac
    case $schema in 0|skip) ;; *) failures=$((failures + 1)) ;; esac
    case $tokenizer in 0|skip) ;; *) failures=$((failures + 1)) ;; esac
    case $reply in 0|skip) ;; *) failures=$((failures + 1)) ;; esac
    case $toolcall in 0|skip) ;; *) failures=$((failures + 1)) ;; esac
    echo "<testsuite name=\"fuzz\" tests=\"8\" failures=\"$failures\">"
    for case in "corpus-replay:$replay" "fuzz-${seconds}s:$fuzz" "artifact-fuzz-${seconds}s:$artifact" "chat-template-fuzz-${seconds}s:$chat" "schema-prefix-fuzz-${seconds}s:$schema" "tokenizer-fuzz-${seconds}s:$tokenizer" "reply-fuzz-${seconds}s:$reply" "tool-call-fuzz-${seconds}s:$toolcall"; do
      echo "  <testcase classname=\"fuzz.gguf-reader\" name=\"${case%%:*}\">"
      case ${case##*:} in
        0) ;;
        skip) echo '    <skipped message="not run"/>' ;;
        *) echo "    <failure message=\"exit status ${case##*:}; see $build/\"/>" ;;
      esac
      echo "  </testcase>"
    done
    echo "</testsuite>"
  } > "$junit"
}

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz: $cxx not found (utils/setup.sh installs clang-22)" >&2
  write_junit 1 skip
  exit 1
fi

mkdir -p "$build/artifacts" "$build/corpus"
# Rebuild only when a source or header is newer than the binary.
if [ ! -x "$bin" ] || [ -n "$(find "${sources[@]}" utils/gguf utils/quant \
    utils/support -newer "$bin" -name '*.[ch]*' | head -n1)" ]; then
  echo "fuzz: building $bin"
  nice "$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -I utils "${sources[@]}" -lfmt -o "$bin"
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

echo "fuzz: replaying $corpus_src/*.gguf"
set +e
"$bin" -runs=0 "$corpus_src"/*.gguf > "$build/replay.log" 2>&1
replay=$?
set -e
[ "$replay" = 0 ] || tail -n 40 "$build/replay.log" >&2

echo "fuzz: fuzzing for ${seconds}s from the corpus (log: $build/fuzz.log)"
cp -n "$corpus_src"/*.gguf "$build/corpus/" 2>/dev/null || true
set +e
nice "$bin" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$build/artifacts/" "$build/corpus" > "$build/fuzz.log" 2>&1
fuzz=$?
set -e
[ "$fuzz" = 0 ] || tail -n 40 "$build/fuzz.log" >&2
grep -E '^stat::number_of_executed_units' "$build/fuzz.log" || true

# The artifact reader: needs the schema's generated header from the main
# build; seeded with real artifacts (tp 1 and 2, with and without logits).
main_build=${KILN_BUILD_DIR:-build}
generated="$main_build/runtime/artifact/generated"
art_bin="$build/artifact-reader-fuzzer"
art_status=skip
art_sources=(test/fuzz/ArtifactReaderFuzzer.cpp runtime/artifact/Artifact.cpp
  utils/support/Error.cpp utils/support/AtomicFile.cpp utils/quant/QuantTypes.cpp)
if [ -f "$generated/artifact/Artifact_generated.h" ] && [ -x "$main_build/bin/kiln-compile" ]; then
  if [ ! -x "$art_bin" ] || [ -n "$(find "${art_sources[@]}" runtime/artifact \
      -newer "$art_bin" -name '*.[ch]*' | head -n1)" ]; then
    echo "fuzz: building $art_bin"
    nice "$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined \
      -fno-sanitize-recover=undefined -I utils -I runtime -I "$generated" \
      "${art_sources[@]}" -lfmt -o "$art_bin"
  fi
  mkdir -p "$build/artifact-corpus"
  if [ ! -f "$build/artifact-corpus/tp1.kiln" ]; then
    "$main_build/bin/kiln-gguf" synth "$build/seed.gguf" --preset tiny --quiet
    "$main_build/bin/kiln-compile" "$build/seed.gguf" --target=cpu --context 8 \
      -o "$build/artifact-corpus/tp1.kiln"
    "$main_build/bin/kiln-compile" "$build/seed.gguf" --target=cpu --context 8 \
      --tp 2 --no-logits -o "$build/artifact-corpus/tp2.kiln"
  fi
  echo "fuzz: fuzzing the artifact reader for ${seconds}s (log: $build/artifact-fuzz.log)"
  set +e
  # test/fuzz/artifact-regressions: inputs that once crashed the reader,
  # run first with the corpus.
  nice "$art_bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/artifact-" \
    "$build/artifact-corpus" test/fuzz/artifact-regressions \
    > "$build/artifact-fuzz.log" 2>&1
  art_status=$?
  set -e
  [ "$art_status" = 0 ] || tail -n 40 "$build/artifact-fuzz.log" >&2
  grep -E '^stat::number_of_executed_units' "$build/artifact-fuzz.log" || true
else
  echo "fuzz: artifact reader skipped: build $main_build first (no generated schema or kiln-compile)"
fi

# A standalone libFuzzer target over runtime/chat or runtime/tokenizer (no
# generated files): built when a source or header is newer than it, then run
# from its corpus folder.
# usage: standalone_target NAME WHAT MAX_LEN SOURCES...; sets target_status.
standalone_target() {
  local name=$1 what=$2 max_len=$3
  shift 3
  local target="$build/$name-fuzzer"
  if [ ! -x "$target" ] || [ -n "$(find "$@" test/fuzz runtime/chat runtime/tokenizer \
      utils/gguf utils/support -newer "$target" -name '*.[ch]*' | head -n1)" ]; then
    echo "fuzz: building $target"
    nice "$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined \
      -fno-sanitize-recover=undefined -I utils -I runtime "$@" \
      -lfmt -o "$target"
  fi
  echo "fuzz: fuzzing $what for ${seconds}s (log: $build/$name-fuzz.log)"
  set +e
  nice "$target" -max_total_time="$seconds" -max_len="$max_len" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$name-" "$build/$name-corpus" \
    > "$build/$name-fuzz.log" 2>&1
  target_status=$?
  set -e
  [ "$target_status" = 0 ] || tail -n 40 "$build/$name-fuzz.log" >&2
  grep -E '^stat::number_of_executed_units' "$build/$name-fuzz.log" || true
}

# Chat templates: the parser and renderer, seeded with Kiln's GLM template.
mkdir -p "$build/chat-template-corpus"
cp -n runtime/chat/glm.jinja "$build/chat-template-corpus/glm.jinja" \
  2>/dev/null || true
standalone_target chat-template "chat templates" 8192 \
  test/fuzz/ChatTemplateFuzzer.cpp runtime/chat/ChatTemplate.cpp \
  runtime/chat/Render.cpp runtime/chat/Value.cpp runtime/chat/PyText.cpp \
  utils/support/Error.cpp
chat_status=$target_status

# Reply constraints: a JSON schema (a request's: untrusted) and a reply.
mkdir -p "$build/schema-prefix-corpus"
printf '{"type":"object","properties":{"a":{"type":"integer"},"b":{"enum":["x",1]}},"required":["a"],"additionalProperties":false}\0{"a":12,"b":"x"}' \
  > "$build/schema-prefix-corpus/object"
printf '{"type":"object","properties":{"v":{"type":"string","pattern":"^(v[0-9]+(\\\\.[0-9]+){0,2}|[^a-c]\\\\d)$"},"w":{"pattern":"\\\\u00e9|x"}}}\0{"v":"v1.2","w":"xx"}' \
  > "$build/schema-prefix-corpus/pattern"
printf '{"$defs":{"n":{"anyOf":[{"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":2},{"type":"string","maxLength":3}]}},"$ref":"#/$defs/n"}\0<think>x</think>[["ab"],"c"]' \
  > "$build/schema-prefix-corpus/recursive"
standalone_target schema-prefix "reply constraints" 4096 \
  test/fuzz/SchemaPrefixFuzzer.cpp runtime/chat/SchemaPrefix.cpp \
  runtime/chat/SchemaPattern.cpp \
  runtime/chat/ThinkFirst.cpp runtime/chat/JsonParse.cpp runtime/chat/JsonValue.cpp \
  runtime/chat/Value.cpp runtime/chat/PyText.cpp utils/support/Error.cpp
schema_status=$target_status

# The tokenizer: a vocabulary description, a NUL byte, then text.
mkdir -p "$build/tokenizer-corpus"
printf 'cab\nchello\n3<|user|>\n4<ud>\n5<unused>\nb256\0hello <|user|>ab <ud> \xF0\x9F\x99\x82 12345' \
  > "$build/tokenizer-corpus/chains"
printf 'm\xC4\xA0 a\n\xC4\xA0a\n3\xC4\xA0b\nm\xC4\xA0 b\0 a b  c' \
  > "$build/tokenizer-corpus/merges"
standalone_target tokenizer "the tokenizer" 4096 \
  test/fuzz/TokenizerFuzzer.cpp runtime/tokenizer/Tokenizer.cpp \
  runtime/tokenizer/PreTokenizer.cpp runtime/tokenizer/Unicode.cpp \
  utils/gguf/GGUFFile.cpp utils/gguf/GGUFValue.cpp utils/quant/QuantTypes.cpp \
  utils/support/Error.cpp
tokenizer_status=$target_status

# A reply's markup: a request's tools JSON, a NUL byte, then the reply.
mkdir -p "$build/reply-corpus"
printf '[{"type":"function","function":{"name":"get","parameters":{"type":"object","properties":{"city":{"type":"string"},"n":{"type":"integer"}}}}}]\0<think>plan</think>\n\nSure.\n<tool_call>get\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>n</arg_key>\n<arg_value>3</arg_value>\n</tool_call>' \
  > "$build/reply-corpus/call"
printf 'null\0  <think>a</thi' > "$build/reply-corpus/cut"
standalone_target reply "a reply's markup" 4096 \
  test/fuzz/ReplyFuzzer.cpp runtime/chat/ToolCalls.cpp \
  runtime/chat/Reasoning.cpp runtime/chat/JsonParse.cpp utils/support/Error.cpp
reply_status=$target_status

# Forced tool calls: a request's tools JSON, a NUL byte, a flag byte (bit 1:
# the first tool named; else bit 0: several calls), then the reply.
mkdir -p "$build/tool-call-corpus"
tools='[{"type":"function","function":{"name":"get","parameters":{"type":"object","properties":{"city":{"type":"string"},"n":{"type":"integer","minimum":0},"tags":{"type":"array","items":{"type":"string"}}},"required":["city"]}}},{"type":"function","function":{"name":"free"}}]'
printf '%s\0\001\n<tool_call>get\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>n</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>free\n<arg_key>x y</arg_key>\n<arg_value>{"a": 1}</arg_value>\n</tool_call>' \
  "$tools" > "$build/tool-call-corpus/several"
printf '%s\0\002<tool_call>get\n<arg_key>tags</arg_key>\n<arg_value>["a","b"]</arg_value>\n<arg_key>city</arg_key>\n<arg_value>x</arg_value>\n</tool_call>  ' \
  "$tools" > "$build/tool-call-corpus/named"
standalone_target tool-call "forced tool calls" 4096 \
  test/fuzz/ToolCallFuzzer.cpp runtime/chat/ForcedCalls.cpp \
  runtime/chat/ToolCallPrefix.cpp runtime/chat/ToolCalls.cpp runtime/chat/SchemaPrefix.cpp \
  runtime/chat/SchemaPattern.cpp runtime/chat/JsonParse.cpp \
  runtime/chat/JsonValue.cpp runtime/chat/Value.cpp runtime/chat/PyText.cpp \
  utils/support/Error.cpp
toolcall_status=$target_status

write_junit "$replay" "$fuzz" "$art_status" "$chat_status" "$schema_status" \
  "$tokenizer_status" "$reply_status" "$toolcall_status"
if [ "$replay" != 0 ] || [ "$fuzz" != 0 ] || [ "$chat_status" != 0 ] || \
    [ "$schema_status" != 0 ] || [ "$tokenizer_status" != 0 ] || \
    [ "$reply_status" != 0 ] || [ "$toolcall_status" != 0 ] || \
    { [ "$art_status" != 0 ] && [ "$art_status" != skip ]; }; then
  echo "fuzz: FAILED (replay status $replay, fuzz status $fuzz, artifact fuzz status $art_status, chat fuzz status $chat_status, schema fuzz status $schema_status, tokenizer fuzz status $tokenizer_status, reply fuzz status $reply_status, tool-call fuzz status $toolcall_status)" >&2
  exit 1
fi
echo "fuzz: OK"
