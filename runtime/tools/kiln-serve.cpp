//===- kiln-serve.cpp - An OpenAI-compatible HTTP server for one model
//-----===//
//
// kiln-serve M.kiln --weights FILE.gguf... [--host H] [--port P]
//            [--model-name NAME] [--max-context N] [--max-request-bytes N]
//            [runtime options]
//
// Serves /v1/completions, /v1/chat/completions (both with "stream": true as
// server-sent events), /v1/models and /health, the way the tools of this
// ecosystem (the openai client, curl) expect. Requests queue and run one at
// a time on the compiled decode step (there is no batching yet); a request
// whose prompt shares a prefix with the cached one evaluates only the rest.
// A client that disconnects mid-stream stops its generation and frees the
// slot. Bad requests get a 4xx with an OpenAI-style error body. With
// "tools", a chat reply's tool calls in GLM's markup come back as OpenAI's
// "tool_calls" (chat/ToolCalls.h), streamed or not; a reply's thinking
// block comes back as "reasoning_content" (chat/Reasoning.h).
// HTTP: cpp-httplib; JSON: nlohmann-json (both from Debian).
//
//===----------------------------------------------------------------------===//
#include "chat/ChatTemplate.h"
#include "chat/ForcedCalls.h"
#include "chat/JsonParse.h"
#include "chat/JsonPrefix.h"
#include "chat/JsonValue.h"
#include "chat/Reasoning.h"
#include "chat/SchemaPrefix.h"
#include "chat/ThinkFirst.h"
#include "chat/ToolCallPrefix.h"
#include "chat/ToolCalls.h"
#include "chat/WhitespaceCap.h"
#include "session/Generator.h"
#include "session/ModelText.h"
#include "session/Session.h"
#include "session/SessionFlags.h"
#include "tokenizer/Tokenizer.h"

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

using namespace kiln;
using namespace kiln::runtime;
using json = nlohmann::ordered_json;

namespace {

/// A request body's JSON (chat::parseOrderedJson: linear in its size), or
/// null where it is none.
json bodyOrNull(const std::string &body) {
  try {
    return chat::parseOrderedJson(body);
  } catch (const json::exception &) {
    return json();
  }
}

constexpr const char *kUsage =
    R"(usage: kiln-serve M.kiln --weights FILE.gguf... [options]

Serves a model compiled by kiln-compile over an OpenAI-compatible HTTP API:
  POST /v1/completions        {"prompt": "...", "max_tokens": N, "stream": bool, ...}
  POST /v1/chat/completions   {"messages": [{"role": "user", "content": "..."}], ...}
  GET  /v1/models, GET /health
  POST /tokenize {"prompt": "..."}, POST /detokenize {"tokens": [...]}
  GET  /metrics (Prometheus: requests, errors, tokens, generation time, queue)
Requests run one at a time (queued); "stream": true sends server-sent events.
A chat request's "tools" go into the prompt through the chat template, and
tool calls the model writes (GLM's <tool_call> markup) come back as
"tool_calls" (finish_reason "tool_calls"); "tool_choice" may be "auto" (the
default), "none" (the reply is left as text), "required" (the reply is one
call or more of the request's functions) or a named function (one call of
it): the last two choose each token among those that keep the reply GLM's
call markup, keys from the function's schema. A chat reply's thinking
block (<think>...</think>, GLM-4.5 and later) comes back as
"reasoning_content" beside "content" (delta.reasoning_content streamed).
"response_format": {"type": "json_object"} constrains the reply to one JSON
object (each token chosen among those that keep it a prefix of one; the
reply ends once the object is whole); {"type": "json_schema", "json_schema":
{"schema": ...}} to one value the schema accepts (docs/serving.md lists
the keywords; any other is refused).

options:
  --weights FILE.gguf...   the model's GGUF file(s)
  --host H                 address to listen on (default 127.0.0.1)
  --port P                 port (default 8080; 0 picks a free one, printed)
  --model-name NAME        the model id reported and accepted (default: the
                           GGUF's general.name, else "kiln")
  --max-context N          refuse a request whose prompt plus max_tokens
                           exceeds N positions (default: the artifact's)
  --max-request-bytes N    refuse a request body of more than N bytes with a
                           413 before reading it (default: 64 MiB)
  --chat-template FILE     render chats with this Jinja template instead of
                           the file's ("glm": Kiln's GLM template, which
                           writes tools and tool calls; docs/chat.md)
  --reasoning MODE         separate (default): a chat reply's thinking block
                           as "reasoning_content"; inline: left in "content"
  --api-key KEY            answer only requests that send "Authorization:
                           Bearer KEY" (401 otherwise; /health stays open);
                           default: $KILN_API_KEY, else no key
  --threads N, --device N, --eager, --one-gpu,
  --backend-dir DIR        as kiln-run
  --help                   this text
)";

/// JSON text; generated text may hold bytes that are not UTF-8 (a random
/// model, a reply cut mid-character): each becomes U+FFFD.
std::string dump(const json &j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

int usageError(const std::string &message) {
  std::fprintf(stderr, "kiln-serve: error: %s\n%s", message.c_str(), kUsage);
  return 2;
}

/// What /metrics reports (Prometheus' text format): counters since start
/// and the queue's gauges. Atomics: handlers run on the server's threads.
struct Metrics {
  std::atomic<uint64_t> completions{0}, chats{0};
  std::atomic<uint64_t> clientErrors{0}, serverErrors{0};
  std::atomic<uint64_t> promptTokens{0}, generatedTokens{0};
  std::atomic<uint64_t> generationMicros{0};
  /// Generated tokens by where they were chosen (GenerateResult::Chooser's
  /// values in order).
  static constexpr GenerateResult::Chooser kChoosers[] = {
      GenerateResult::Chooser::StepArgmax, GenerateResult::Chooser::StepDraw,
      GenerateResult::Chooser::Host};
  std::atomic<uint64_t> byChooser[std::size(kChoosers)] = {};
  std::atomic<int64_t> waiting{0}, running{0};

  std::string text() const {
    std::string out;
    auto metric = [&](const char *name, const char *type, const char *help,
                      const std::string &samples) {
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}", name, help, name,
                         type, samples);
    };
    metric("kiln_requests_total", "counter", "Requests accepted, by endpoint.",
           fmt::format("kiln_requests_total{{endpoint=\"completions\"}} {}\n"
                       "kiln_requests_total{{endpoint=\"chat\"}} {}\n",
                       completions.load(), chats.load()));
    metric("kiln_request_errors_total", "counter",
           "Requests answered with an error, by class.",
           fmt::format("kiln_request_errors_total{{class=\"4xx\"}} {}\n"
                       "kiln_request_errors_total{{class=\"5xx\"}} {}\n",
                       clientErrors.load(), serverErrors.load()));
    metric("kiln_prompt_tokens_total", "counter", "Prompt tokens of requests.",
           fmt::format("kiln_prompt_tokens_total {}\n", promptTokens.load()));
    metric("kiln_generated_tokens_total", "counter", "Tokens generated.",
           fmt::format("kiln_generated_tokens_total {}\n",
                       generatedTokens.load()));
    metric("kiln_generated_tokens_by_chooser_total", "counter",
           "Tokens generated, by where they were chosen: the step's argmax "
           "(greedy), the step's draw (a temperature with its top_p, top_k "
           "and min_p, and penalties and biases the step adjusts the "
           "logits for; no logits copied) or the host (constraints, and "
           "what the artifact's step does not make).",
           [&] {
             std::string samples;
             for (size_t i = 0; i < std::size(kChoosers); ++i)
               samples += fmt::format(
                   "kiln_generated_tokens_by_chooser_total{{chooser=\"{}\"}} "
                   "{}\n",
                   chooserName(kChoosers[i]), byChooser[i].load());
             return samples;
           }());
    metric("kiln_generation_seconds_total", "counter",
           "Time in the generation loop (tokens / this is the decode rate).",
           fmt::format("kiln_generation_seconds_total {:.6f}\n",
                       double(generationMicros.load()) * 1e-6));
    metric("kiln_requests_waiting", "gauge",
           "Requests queued behind the one running.",
           fmt::format("kiln_requests_waiting {}\n", waiting.load()));
    metric("kiln_requests_running", "gauge", "Requests generating (0 or 1).",
           fmt::format("kiln_requests_running {}\n", running.load()));
    return out;
  }

  /// One generation's figures.
  void generated(const GenerateResult &r) {
    generatedTokens += r.tokens.size();
    generationMicros += uint64_t(r.seconds * 1e6);
    for (size_t i = 0; i < std::size(kChoosers); ++i)
      if (kChoosers[i] == r.chooser)
        byChooser[i] += r.tokens.size();
  }
};

Metrics gMetrics;

/// The generation slot, held while a request generates; counted in the
/// queue's gauges while it waits and while it runs.
class Slot {
public:
  explicit Slot(std::mutex &busy) : busy_(busy) {
    ++gMetrics.waiting;
    busy_.lock();
    --gMetrics.waiting;
    ++gMetrics.running;
  }
  ~Slot() {
    --gMetrics.running;
    busy_.unlock();
  }
  Slot(const Slot &) = delete;
  Slot &operator=(const Slot &) = delete;

private:
  std::mutex &busy_;
};

/// An OpenAI-style error body.
void sendError(httplib::Response &res, int status, const std::string &message,
               const char *type = "invalid_request_error",
               const char *param = nullptr, const char *code = nullptr) {
  json body = {{"error",
                {{"message", message},
                 {"type", type},
                 {"param", param ? json(param) : json(nullptr)},
                 {"code", code ? json(code) : json(nullptr)}}}};
  res.status = status;
  ++(status >= 500 ? gMetrics.serverErrors : gMetrics.clientErrors);
  res.set_content(dump(body), "application/json");
}

/// A request's problem, reported as a 400 naming the parameter.
struct BadRequest {
  std::string message;
  std::string param;
};

/// The most choices ("n") a request may ask for.
constexpr int64_t kMaxChoices = 64;

/// What both endpoints share: sampling, limits and stops, read and checked.
struct RequestOptions {
  GenerateOptions generate;
  bool stream = false;
  /// "n": choices generated one after another from the same prompt, choice
  /// i sampled with seed + i.
  int choices = 1;
  /// A completion's "echo": the prompt's text (and, with logprobs, its
  /// tokens' log-probabilities) before the completion's.
  bool echo = false;
  /// stream_options.include_usage: a last chunk with the usage.
  bool streamUsage = false;
  /// The request's "tools" (null when none), and whether the reply is
  /// parsed for tool calls (tools given, tool_choice not "none").
  json tools;
  bool toolCalls = false;
};

template <typename T>
T number(const json &body, const char *key, T fallback, T low, T high) {
  if (!body.contains(key) || body[key].is_null())
    return fallback;
  const json &v = body[key];
  if (!v.is_number())
    throw BadRequest{fmt::format("'{}' must be a number", key), key};
  T x = v.get<T>();
  if (!(x >= low && x <= high))
    throw BadRequest{fmt::format("'{}' must be within [{}, {}]", key, low, high),
                     key};
  return x;
}

RequestOptions readOptions(const json &body, const tokenizer::Tokenizer &tok,
                           bool chat) {
  RequestOptions o;
  if (!chat && body.contains("echo") && !body["echo"].is_null()) {
    if (!body["echo"].is_boolean())
      throw BadRequest{"'echo' must be a boolean", "echo"};
    o.echo = body["echo"].get<bool>();
  }
  // With echo, max_tokens 0 scores the prompt alone (as evaluation
  // harnesses ask).
  const int64_t least = o.echo ? 0 : 1;
  o.generate.maxTokens =
      number<int64_t>(body, "max_tokens", 16, least, int64_t(1) << 30);
  if (body.contains("max_completion_tokens"))
    o.generate.maxTokens = number<int64_t>(body, "max_completion_tokens", 16,
                                           least, int64_t(1) << 30);
  SamplingOptions &s = o.generate.sampling;
  s.temperature = number<double>(body, "temperature", 1.0, 0.0, 2.0);
  s.topP = number<double>(body, "top_p", 1.0, 1e-9, 1.0);
  s.topK = number<int64_t>(body, "top_k", 0, 0, 1 << 30);
  s.minP = number<double>(body, "min_p", 0.0, 0.0, 0.999999);
  s.repeatPenalty =
      number<double>(body, "repetition_penalty", 1.0, 1e-6, 100.0);
  s.frequencyPenalty =
      number<double>(body, "frequency_penalty", 0.0, -2.0, 2.0);
  s.presencePenalty = number<double>(body, "presence_penalty", 0.0, -2.0, 2.0);
  s.seed = number<uint64_t>(body, "seed", 0, 0, UINT64_MAX);
  o.choices = int(number<int64_t>(body, "n", 1, 1, kMaxChoices));
  // logit_bias: {"token id": bias in [-100, 100]}, added before sampling.
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
    const json &bias = body["logit_bias"];
    if (!bias.is_object())
      throw BadRequest{"'logit_bias' must be an object of token ids",
                       "logit_bias"};
    for (const auto &[key, value] : bias.items()) {
      uint64_t id = 0;
      if (!parseUnsigned(key.c_str(), 0, uint64_t(tok.vocabSize() - 1), id))
        throw BadRequest{fmt::format("'logit_bias' key '{}' is not a token id "
                                     "in [0, {})",
                                     key, tok.vocabSize()),
                         "logit_bias"};
      if (!value.is_number() ||
          !(value.get<double>() >= -100 && value.get<double>() <= 100))
        throw BadRequest{"'logit_bias' values must be numbers in [-100, 100]",
                         "logit_bias"};
      s.logitBias.emplace_back(int32_t(id), value.get<float>());
    }
  }
  // What would change the reply in ways this server does not do: refused,
  // not ignored.
  // {"type": "json_object"}: the reply is one JSON object, each token
  // chosen among those that keep it a prefix of one. {"type":
  // "json_schema", "json_schema": {"schema": ...}}: one JSON value the
  // schema accepts (chat/SchemaPrefix.h says which keywords; others are
  // refused by their place in the schema).
  if (body.contains("response_format") && !body["response_format"].is_null()) {
    const json &rf = body["response_format"];
    const std::string type =
        rf.is_object() && rf.contains("type") && rf["type"].is_string()
            ? rf["type"].get<std::string>()
            : "";
    if (type == "json_object") {
      o.generate.constraint = [] {
        return std::make_unique<chat::WhitespaceCap>(
            std::make_unique<chat::JsonPrefix>());
      };
    } else if (type == "json_schema") {
      const json *js =
          rf.contains("json_schema") ? &rf["json_schema"] : nullptr;
      if (!js || !js->is_object() || !js->contains("schema") ||
          !((*js)["schema"].is_object() || (*js)["schema"].is_boolean()))
        throw BadRequest{"'response_format' json_schema needs "
                         "\"json_schema\": {\"schema\": {...}}",
                         "response_format"};
      const std::string where = "'response_format' json_schema.schema";
      Expected<chat::Value> value = chat::valueFromJson((*js)["schema"], where);
      if (!value)
        throw BadRequest{value.error().message(), "response_format"};
      Expected<std::shared_ptr<const chat::JsonSchema>> schema =
          chat::JsonSchema::compile(*value, where);
      if (!schema)
        throw BadRequest{schema.error().message(), "response_format"};
      o.generate.constraint = [schema = *schema] {
        return std::make_unique<chat::WhitespaceCap>(
            std::make_unique<chat::SchemaPrefix>(schema));
      };
    } else if (type != "text") {
      throw BadRequest{"'response_format' must be {\"type\": \"text\"}, "
                       "{\"type\": \"json_object\"} or {\"type\": "
                       "\"json_schema\", \"json_schema\": {...}}",
                       "response_format"};
    }
  }
  if (!chat && body.contains("suffix") && !body["suffix"].is_null())
    throw BadRequest{"'suffix' (text after the completion) is not supported",
                     "suffix"};
  if (!chat && body.contains("best_of") && !body["best_of"].is_null() &&
      number<int64_t>(body, "best_of", 1, 1, kMaxChoices) != o.choices)
    throw BadRequest{"'best_of' other than n is not supported", "best_of"};
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json &stop = body["stop"];
    if (stop.is_string()) {
      o.generate.stopStrings.push_back(stop.get<std::string>());
    } else if (stop.is_array() && stop.size() <= 4) {
      for (const json &item : stop) {
        if (!item.is_string() || item.get<std::string>().empty())
          throw BadRequest{"'stop' entries must be non-empty strings", "stop"};
        o.generate.stopStrings.push_back(item.get<std::string>());
      }
    } else {
      throw BadRequest{"'stop' must be a string or up to 4 strings", "stop"};
    }
  }
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean())
      throw BadRequest{"'stream' must be a boolean", "stream"};
    o.stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json &so = body["stream_options"];
    if (!o.stream)
      throw BadRequest{"'stream_options' goes with \"stream\": true",
                       "stream_options"};
    if (!so.is_object() ||
        (so.contains("include_usage") && !so["include_usage"].is_boolean()))
      throw BadRequest{"'stream_options' must be an object whose "
                       "'include_usage' is a boolean",
                       "stream_options"};
    o.streamUsage = so.value("include_usage", false);
  }
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array())
      throw BadRequest{"'tools' must be an array", "tools"};
    o.tools = body["tools"];
  }
  // tool_choice: "auto" (the default), "none", "required" (the reply is one
  // call or more of the request's functions), or {"type": "function",
  // "function": {"name": N}} (one call of N). The last two constrain
  // generation to GLM's call markup (chat::ToolCallPrefix).
  std::string choice = "auto", forced;
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const json &c = body["tool_choice"];
    if (c.is_string() && (c == "auto" || c == "none" || c == "required")) {
      choice = c.get<std::string>();
    } else if (c.is_object() && c.value("type", json()) == "function" &&
               c.contains("function") && c["function"].is_object() &&
               c["function"].contains("name") &&
               c["function"]["name"].is_string()) {
      choice = "function";
      forced = c["function"]["name"].get<std::string>();
    } else {
      throw BadRequest{
          fmt::format("'tool_choice' {} is not one of \"auto\", \"none\", "
                      "\"required\" or {{\"type\": \"function\", "
                      "\"function\": {{\"name\": ...}}}}",
                      dump(c)),
          "tool_choice"};
    }
  }
  if (choice == "required" || choice == "function") {
    if (o.tools.empty())
      throw BadRequest{"'tool_choice' " +
                           std::string(choice == "required"
                                           ? "\"required\""
                                           : "naming a function") +
                           " needs 'tools'",
                       "tool_choice"};
    if (o.generate.constraint)
      throw BadRequest{"'tool_choice' that forces a call and a JSON "
                       "'response_format' exclude each other",
                       "tool_choice"};
    Expected<std::vector<chat::ToolSignature>> found =
        chat::forcedCallSignatures(o.tools, forced);
    if (!found)
      throw BadRequest{found.error().problem(), found.error().field()};
    std::vector<chat::ToolSignature> signatures = std::move(*found);
    const bool several = choice == "required";
    o.generate.constraint = [signatures, several] {
      return std::make_unique<chat::ToolCallPrefix>(signatures, several);
    };
  }
  o.toolCalls = !o.tools.empty() && choice != "none";
  // Log-probabilities: chat's "logprobs": true with "top_logprobs" 0..20, a
  // completion's "logprobs": 0..5 (the alternatives per token).
  if (chat) {
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
      if (!body["logprobs"].is_boolean())
        throw BadRequest{"'logprobs' must be a boolean", "logprobs"};
      if (body["logprobs"].get<bool>())
        o.generate.logprobs = 0;
    }
    if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
      if (o.generate.logprobs < 0)
        throw BadRequest{"'top_logprobs' needs \"logprobs\": true",
                         "top_logprobs"};
      o.generate.logprobs = number<int32_t>(body, "top_logprobs", 0, 0, 20);
    }
  } else if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    o.generate.logprobs = number<int32_t>(body, "logprobs", 0, 0, 5);
  }
  if (o.generate.logprobs >= 0 && o.stream)
    throw BadRequest{"log-probabilities are not streamed; ask for them "
                     "without \"stream\": true",
                     "logprobs"};
  if (o.echo && o.stream)
    throw BadRequest{"'echo' is not streamed; ask for it without "
                     "\"stream\": true",
                     "echo"};
  o.generate.stopIds = tok.endOfReplyIds();
  return o;
}

/// A token's text (its bytes; JSON output replaces what is not UTF-8).
std::string tokenText(const tokenizer::Tokenizer &tok, int32_t id) {
  std::optional<std::string_view> bytes = tok.tokenBytes(id);
  return bytes ? std::string(*bytes) : std::string();
}

/// Chat's "logprobs": {"content": [{token, logprob, bytes, top_logprobs}]}.
json chatLogprobs(const std::vector<TokenLogprob> &lps,
                  const tokenizer::Tokenizer &tok) {
  auto entry = [&](int32_t id, double logprob) {
    std::string text = tokenText(tok, id);
    json bytes = json::array();
    for (unsigned char c : text)
      bytes.push_back(int(c));
    return json{{"token", text}, {"logprob", logprob}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const TokenLogprob &lp : lps) {
    json e = entry(lp.token, lp.logprob);
    e["top_logprobs"] = json::array();
    for (auto [id, logprob] : lp.top)
      e["top_logprobs"].push_back(entry(id, logprob));
    content.push_back(std::move(e));
  }
  return {{"content", content}};
}

/// A completion's "logprobs": tokens, token_logprobs, top_logprobs (a map
/// of token text to log-probability each) and text_offset (each token's
/// byte offset in the completion's text).
/// With echo, `prompt` (its first token has no log-probability: null) comes
/// first, and the offsets run over the prompt's text then the completion's.
json completionLogprobs(const std::vector<TokenLogprob> &lps,
                        const tokenizer::Tokenizer &tok,
                        const std::vector<TokenLogprob> &prompt = {}) {
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  size_t offset = 0;
  for (size_t i = 0; i < prompt.size() + lps.size(); ++i) {
    const bool first = i == 0 && !prompt.empty();
    const TokenLogprob &lp =
        i < prompt.size() ? prompt[i] : lps[i - prompt.size()];
    std::string text = tokenText(tok, lp.token);
    out["tokens"].push_back(text);
    out["token_logprobs"].push_back(first ? json(nullptr) : json(lp.logprob));
    json top = first ? json(nullptr) : json::object();
    // Tokens of the same text (as JSON writes it: bytes that are not UTF-8
    // become U+FFFD) share a key: it keeps the likelier one's.
    for (auto [id, logprob] : lp.top) {
      std::string key =
          json::parse(dump(json(tokenText(tok, id)))).get<std::string>();
      if (!top.contains(key))
        top[key] = logprob;
    }
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(offset);
    offset += text.size();
  }
  return out;
}

/// OpenAI's "tool_calls" entries for `calls`; ids unique per request.
json toolCallsJson(const std::vector<chat::ToolCall> &calls,
                   const std::string &requestId, bool withIndex) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json call = {
        {"id", fmt::format("call_{}_{}", requestId, i)},
        {"type", "function"},
        {"function",
         {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (withIndex)
      call["index"] = i;
    out.push_back(std::move(call));
  }
  return out;
}

class Server {
public:
  Server(Session &session, tokenizer::Tokenizer tok,
         chat::ChatTemplate chatTemplate, std::string model,
         uint64_t maxContext, bool separateReasoning)
      : session_(session), tok_(std::move(tok)),
        chatTemplate_(std::move(chatTemplate)), model_(std::move(model)),
        maxContext_(maxContext), separateReasoning_(separateReasoning),
        templateReadsTools_(chatTemplate_.readsVariable("tools")),
        generator_(session_, &tok_), created_(std::time(nullptr)) {}

  /// The routes; with `apiKey`, every one but /health asks for it.
  void install(httplib::Server &http, const std::string &apiKey);

private:
  void completions(const httplib::Request &req, httplib::Response &res,
                   bool chat);
  /// One choice of a non-streamed reply: the text (a completion's after
  /// `echo`), or the chat message with its reasoning and tool calls, and
  /// the log-probabilities asked for.
  json replyChoice(const GenerateResult &r, int index, bool chat,
                   const RequestOptions &options, const std::string &id,
                   const std::string &echo,
                   const std::vector<TokenLogprob> &promptLogprobs,
                   const char *finish) const;
  /// The prompt tokens of a request, or a BadRequest.
  std::vector<int32_t> promptOf(const json &body, bool chat);
  json usage(size_t prompt, size_t completion) const {
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion}};
  }
  std::string nextId(bool chat) {
    return fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", ++requests_);
  }

  Session &session_;
  tokenizer::Tokenizer tok_;
  chat::ChatTemplate chatTemplate_;
  std::string model_;
  uint64_t maxContext_;
  /// A chat reply's thinking block as "reasoning_content" (--reasoning).
  bool separateReasoning_;
  /// Whether the chat template reads `tools` (asked once, at start).
  bool templateReadsTools_;
  /// One generation at a time: the caches hold one sequence.
  std::mutex busy_;
  Generator generator_;
  std::time_t created_;
  std::atomic<uint64_t> requests_{0};
};

std::vector<int32_t> Server::promptOf(const json &body, bool chat) {
  std::string text;
  if (chat) {
    if (!body.contains("messages") || !body["messages"].is_array() ||
        body["messages"].empty())
      throw BadRequest{"'messages' must be a non-empty array", "messages"};
    for (const json &m : body["messages"])
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        throw BadRequest{"each message needs a string 'role'", "messages"};
    // Arguments of earlier calls arrive as JSON text; the template writes
    // them key by key, the form the model itself writes.
    json history = body["messages"];
    chat::argumentsToObjects(history);
    Expected<chat::Value> messages = chat::valueFromJson(history, "messages");
    if (!messages)
      throw BadRequest{messages.error().message(), "messages"};
    chat::Value tools;
    if (body.contains("tools") && !body["tools"].is_null() &&
        !body["tools"].empty() && !templateReadsTools_)
      throw BadRequest{"this model's chat template does not read 'tools', so "
                       "the model would never see them (kiln-serve "
                       "--chat-template glm uses Kiln's GLM template, which "
                       "does)",
                       "tools"};
    if (body.contains("tools")) {
      Expected<chat::Value> t = chat::valueFromJson(body["tools"], "tools");
      if (!t)
        throw BadRequest{t.error().message(), "tools"};
      tools = *t;
    }
    chat::Value context =
        chat::chatContext(*messages, /*addGenerationPrompt=*/true,
                          std::nullopt, std::nullopt, tools);
    // chat_template_kwargs (vLLM's name): more variables for the template,
    // e.g. {"enable_thinking": false} for GLM's.
    if (body.contains("chat_template_kwargs") &&
        !body["chat_template_kwargs"].is_null()) {
      const json &extra = body["chat_template_kwargs"];
      if (!extra.is_object())
        throw BadRequest{"'chat_template_kwargs' must be an object",
                         "chat_template_kwargs"};
      chat::ValueMap vars = context.asMap();
      for (const auto &[name, value] : extra.items()) {
        if (name == "messages" || name == "tools" ||
            name == "add_generation_prompt")
          throw BadRequest{"'chat_template_kwargs' may not set '" + name + "'",
                           "chat_template_kwargs"};
        Expected<chat::Value> v =
            chat::valueFromJson(value, "chat_template_kwargs");
        if (!v)
          throw BadRequest{v.error().message(), "chat_template_kwargs"};
        vars.set(name, *v);
      }
      context = chat::Value::map(std::move(vars));
    }
    Expected<std::string> rendered = chatTemplate_.render(context);
    if (!rendered)
      throw BadRequest{"the chat template refused the conversation: " +
                           rendered.error().message(),
                       "messages"};
    text = std::move(*rendered);
  } else {
    if (!body.contains("prompt") || !body["prompt"].is_string())
      throw BadRequest{"'prompt' must be a string", "prompt"};
    text = body["prompt"].get<std::string>();
  }
  // Chat markers in the rendered text are special tokens; a raw prompt's
  // text is taken as text too, markers included (as the model's own API).
  std::vector<int32_t> tokens = tok_.encode(text, /*parseSpecial=*/true);
  if (tokens.empty())
    throw BadRequest{"the prompt encodes to no tokens", chat ? "messages"
                                                             : "prompt"};
  return tokens;
}

json Server::replyChoice(const GenerateResult &r, int index, bool chat,
                         const RequestOptions &options, const std::string &id,
                         const std::string &echo,
                         const std::vector<TokenLogprob> &promptLogprobs,
                         const char *finish) const {
  json choice = {{"index", index}, {"finish_reason", finish}};
  if (!chat) {
    choice["text"] = echo + r.text;
    choice["logprobs"] =
        options.generate.logprobs >= 0
            ? completionLogprobs(r.logprobs, tok_, promptLogprobs)
            : json(nullptr);
    return choice;
  }
  chat::SplitReply split{"", r.text};
  if (separateReasoning_)
    split = chat::splitReasoning(r.text);
  chat::ParsedReply reply;
  if (options.toolCalls)
    reply = chat::parseToolCalls(split.answer, options.tools);
  if (!reply.calls.empty()) {
    choice["message"] = {
        {"role", "assistant"},
        {"content",
         reply.content.empty() ? json(nullptr) : json(reply.content)},
        {"tool_calls",
         toolCallsJson(reply.calls, fmt::format("{}_{}", id, index), false)}};
    choice["finish_reason"] = "tool_calls";
  } else {
    choice["message"] = {{"role", "assistant"}, {"content", split.answer}};
  }
  if (!split.reasoning.empty())
    choice["message"]["reasoning_content"] = split.reasoning;
  choice["logprobs"] = options.generate.logprobs >= 0
                           ? chatLogprobs(r.logprobs, tok_)
                           : json(nullptr);
  return choice;
}

void Server::completions(const httplib::Request &req, httplib::Response &res,
                         bool chat) {
  json body;
  std::vector<int32_t> prompt;
  RequestOptions options;
  try {
    body = chat::parseOrderedJson(req.body);
    if (!body.is_object())
      throw BadRequest{"the body must be a JSON object", ""};
    if (body.contains("model") &&
        (!body["model"].is_string() || body["model"].get<std::string>() !=
                                           model_))
      return sendError(res, 404,
                       fmt::format("the model {} does not exist; this "
                                   "server serves '{}'",
                                   dump(body["model"]), model_),
                       "invalid_request_error", "model", "model_not_found");
    options = readOptions(body, tok_, chat);
    // A chat reply whose thinking block comes back apart may think before
    // its constrained answer (chat/ThinkFirst.h), unless the request turns
    // thinking off ({"chat_template_kwargs": {"enable_thinking": false}}).
    const bool noThinking =
        chat && body.contains("chat_template_kwargs") &&
        body["chat_template_kwargs"].is_object() &&
        body["chat_template_kwargs"].contains("enable_thinking") &&
        body["chat_template_kwargs"]["enable_thinking"] == false;
    if (chat && separateReasoning_ && !noThinking &&
        options.generate.constraint)
      options.generate.constraint = [inner = options.generate.constraint] {
        return std::make_unique<chat::ThinkFirst>(inner());
      };
    prompt = promptOf(body, chat);
  } catch (const chat::JsonTooDeep &e) {
    return sendError(res, 400, std::string("the body is refused: ") + e.what());
  } catch (const json::exception &e) {
    return sendError(res, 400, std::string("the body is not valid JSON: ") +
                                   e.what());
  } catch (const BadRequest &e) {
    return sendError(res, 400, e.message, "invalid_request_error",
                     e.param.empty() ? nullptr : e.param.c_str());
  }
  if (options.generate.constraint && !session_.hasLogits())
    return sendError(res, 400,
                     "a constrained reply ('response_format' JSON or a forced "
                     "'tool_choice') needs the logits: the artifact was "
                     "compiled with --no-logits",
                     "invalid_request_error", "response_format");
  if (!session_.hasLogits() &&
      (needsHostLogits(session_, options.generate.sampling) ||
       options.generate.logprobs >= 0)) {
    // The parameter that needs them: the first of those the request set.
    const SamplingOptions &so = options.generate.sampling;
    const char *param = options.generate.logprobs >= 0 ? "logprobs"
                        : !so.logitBias.empty()        ? "logit_bias"
                        : so.frequencyPenalty != 0     ? "frequency_penalty"
                        : so.presencePenalty != 0      ? "presence_penalty"
                        : so.repeatPenalty != 1        ? "repetition_penalty"
                        : so.topK > 0 && so.topK < session_.vocab() ? "top_k"
                        : so.topP < 1                               ? "top_p"
                        : so.minP > 0                               ? "min_p"
                                      : "temperature";
    return sendError(res, 400,
                     fmt::format("'{}' needs the logits: the artifact was "
                                 "compiled with --no-logits, and its step "
                                 "makes {}",
                                 param, stepChoices(session_, so)),
                     "invalid_request_error", param);
  }
  uint64_t needed = prompt.size() + uint64_t(options.generate.maxTokens);
  if (needed > maxContext_)
    return sendError(res, 400,
                     fmt::format("this request needs {} positions ({} prompt "
                                 "tokens + max_tokens {}); the limit is {}",
                                 needed, prompt.size(),
                                 options.generate.maxTokens, maxContext_),
                     "invalid_request_error", "max_tokens",
                     "context_length_exceeded");

  std::string id = nextId(chat);
  ++(chat ? gMetrics.chats : gMetrics.completions);
  gMetrics.promptTokens += prompt.size();
  std::time_t created = std::time(nullptr);
  const char *object = chat ? "chat.completion" : "text_completion";
  auto finishReason = [](const GenerateResult &r) {
    return r.stoppedAtId || r.stoppedAtString || r.stoppedWhole ? "stop"
                                                                : "length";
  };

  if (!options.stream) {
    Slot slot(busy_);
    // Echoed log-probabilities need every prompt position's logits: the
    // prompt is evaluated whole, not after the cached prefix.
    const bool scorePrompt = options.echo && options.generate.logprobs >= 0;
    std::vector<float> promptLogits;
    json choices = json::array();
    size_t completionTokens = 0;
    std::vector<TokenLogprob> promptLogprobs;
    for (int index = 0; index < options.choices; ++index) {
      Status fed = Status::ok();
      GenerateOptions generate = options.generate;
      generate.sampling.seed += uint64_t(index);
      generator_.plan(generate);
      if (scorePrompt && index == 0)
        fed = generator_.feed(prompt, 0, &promptLogits);
      else if (Expected<size_t> n = generator_.feedConversation(prompt); !n)
        fed = n.error();
      Expected<GenerateResult> r = fed ? generator_.generate(generate)
                                       : Expected<GenerateResult>(fed.error());
      if (!r)
        return sendError(res, 500, r.error().message(), "server_error");
      if (scorePrompt && index == 0) {
        const size_t vocab = promptLogits.size() / prompt.size();
        promptLogprobs.push_back({prompt[0], 0, {}});
        for (size_t i = 1; i < prompt.size(); ++i)
          promptLogprobs.push_back(
              tokenLogprob(std::span<const float>(promptLogits)
                               .subspan((i - 1) * vocab, vocab),
                           prompt[i], options.generate.logprobs));
      }
      completionTokens += r->tokens.size();
      gMetrics.generated(*r);
      choices.push_back(
          replyChoice(*r, index, chat, options, id,
                      options.echo ? body["prompt"].get<std::string>() : "",
                      promptLogprobs, finishReason(*r)));
    }
    json out = {{"id", id},
                {"object", object},
                {"created", created},
                {"model", model_},
                {"choices", choices},
                {"usage", usage(prompt.size(), completionTokens)}};
    res.set_content(dump(out), "application/json");
    return;
  }

  // Streaming: the generation runs in the content provider, chunk by chunk;
  // a failed write (the client went away) stops it and frees the slot.
  const char *chunkObject = chat ? "chat.completion.chunk" : "text_completion";
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, prompt, options, id, created, chat, chunkObject,
       finishReason](size_t, httplib::DataSink &sink) -> bool {
       try {
        auto send = [&](const json &choice) {
          json chunk = {{"id", id},
                        {"object", chunkObject},
                        {"created", created},
                        {"model", model_},
                        {"choices", json::array({choice})}};
          std::string event = "data: " + dump(chunk) + "\n\n";
          return sink.write(event.data(), event.size());
        };
        Slot slot(busy_);
        // Choices one after another, each ended by its finish chunk.
        size_t completionTokens = 0;
        for (int index = 0; index < options.choices; ++index) {
          bool open = true;
          if (chat)
            open = send({{"index", index},
                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                         {"finish_reason", nullptr}});
          if (!open) { // the client went away
            sink.done();
            return false;
          }
          GenerateOptions generate = options.generate;
          generate.sampling.seed += uint64_t(index);
          generator_.plan(generate);
          if (Expected<size_t> fed = generator_.feedConversation(prompt); !fed)
            throw std::runtime_error(fed.error().message());
          // With tools, text that may begin a call is held back, and the
          // calls are sent once the reply has ended.
          chat::ToolCallStream calls;
          const bool parse = chat && options.toolCalls;
          // A chat delta of `key` (content, reasoning_content), if any.
          auto delta = [&](const char *key, std::string_view text) {
            if (text.empty())
              return true;
            return send({{"index", index},
                         {"delta", {{key, std::string(text)}}},
                         {"finish_reason", nullptr}});
          };
          auto content = [&](std::string_view text) {
            return delta("content", text);
          };
          // The answer's text (a completion's text), through the tool-call
          // filter where there are tools.
          auto answer = [&](std::string_view piece) {
            if (piece.empty())
              return true;
            if (parse)
              return content(calls.push(piece));
            if (chat)
              return content(piece);
            return send({{"index", index},
                         {"finish_reason", nullptr},
                         {"text", std::string(piece)},
                         {"logprobs", nullptr}});
          };
          // A chat reply's thinking block as delta.reasoning_content.
          chat::ReasoningStream thinking;
          const bool split = chat && separateReasoning_;
          auto reasoning = [&](std::string_view text) {
            return delta("reasoning_content", text);
          };
          Expected<GenerateResult> r =
              generator_.generate(generate, [&](std::string_view piece) {
                if (!split)
                  return answer(piece);
                chat::SplitReply part = thinking.push(piece);
                return reasoning(part.reasoning) && answer(part.answer);
              });
          if (!r)
            throw std::runtime_error(r.error().message());
          if (r->stoppedByCaller) { // the client went away
            sink.done();
            return true;
          }
          std::string finish = finishReason(*r);
          if (split) {
            chat::SplitReply rest = thinking.finish();
            reasoning(rest.reasoning);
            answer(rest.answer);
          }
          if (parse) {
            chat::ParsedReply rest = calls.finish(options.tools);
            content(rest.content);
            if (!rest.calls.empty()) {
              send({{"index", index},
                    {"delta",
                     {{"tool_calls",
                       toolCallsJson(rest.calls,
                                     fmt::format("{}_{}", id, index), true)}}},
                    {"finish_reason", nullptr}});
              finish = "tool_calls";
            }
          }
          json last = {{"index", index}, {"finish_reason", finish}};
          if (chat)
            last["delta"] = json::object();
          else
            last["text"] = "", last["logprobs"] = nullptr;
          send(last);
          completionTokens += r->tokens.size();
          gMetrics.generated(*r);
        }
        if (options.streamUsage) {
          json chunk = {{"id", id},
                        {"object", chunkObject},
                        {"created", created},
                        {"model", model_},
                        {"choices", json::array()},
                        {"usage", usage(prompt.size(), completionTokens)}};
          std::string event = "data: " + dump(chunk) + "\n\n";
          sink.write(event.data(), event.size());
        }
        std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
       } catch (const std::exception &e) {
        // Headers are gone: end the stream with an error event.
        ++gMetrics.serverErrors;
        std::string event = "data: " +
                            dump({{"error", {{"message", e.what()},
                                             {"type", "server_error"}}}}) +
                            "\n\n";
        sink.write(event.data(), event.size());
        sink.done();
        return false;
       }
      });
}

void Server::install(httplib::Server &http, const std::string &apiKey) {
  // --api-key: every route but /health wants "Authorization: Bearer KEY"
  // (compared in constant time, so the key does not leak through timing).
  if (!apiKey.empty())
    http.set_pre_routing_handler([apiKey](const httplib::Request &req,
                                          httplib::Response &res) {
      if (req.path == "/health")
        return httplib::Server::HandlerResponse::Unhandled;
      const std::string given = req.get_header_value("Authorization");
      const std::string want = "Bearer " + apiKey;
      unsigned char diff = given.size() == want.size() ? 0 : 1;
      for (size_t i = 0; i < want.size(); ++i)
        diff |= static_cast<unsigned char>((i < given.size() ? given[i] : 0) ^
                                           want[i]);
      if (diff == 0)
        return httplib::Server::HandlerResponse::Unhandled;
      sendError(res, 401,
                "a valid API key is needed: send 'Authorization: Bearer KEY'",
                "invalid_request_error", nullptr, "invalid_api_key");
      return httplib::Server::HandlerResponse::Handled;
    });
  http.Get("/health", [](const httplib::Request &, httplib::Response &res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http.Get("/metrics", [](const httplib::Request &, httplib::Response &res) {
    res.set_content(gMetrics.text(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request &,
                                httplib::Response &res) {
    json out = {{"object", "list"},
                {"data", json::array({{{"id", model_},
                                       {"object", "model"},
                                       {"created", created_},
                                       {"owned_by", "kiln"}}})}};
    res.set_content(dump(out), "application/json");
  });
  // The model's tokenizer, as vLLM's server offers it: text to ids (the
  // text's special-token markers parsed, as prompts are) and back.
  http.Post("/tokenize", [this](const httplib::Request &req,
                                httplib::Response &res) {
    json body = bodyOrNull(req.body);
    if (!body.is_object() || !body.contains("prompt") ||
        !body["prompt"].is_string())
      return sendError(res, 400, "'prompt' must be a string",
                       "invalid_request_error", "prompt");
    std::vector<int32_t> ids =
        tok_.encode(body["prompt"].get<std::string>(), /*parseSpecial=*/true);
    res.set_content(dump({{"tokens", ids},
                          {"count", ids.size()},
                          {"max_model_len", maxContext_}}),
                    "application/json");
  });
  http.Post("/detokenize", [this](const httplib::Request &req,
                                  httplib::Response &res) {
    json body = bodyOrNull(req.body);
    std::vector<int32_t> ids;
    bool ok = body.is_object() && body.contains("tokens") &&
              body["tokens"].is_array();
    if (ok)
      for (const json &t : body["tokens"]) {
        if (!t.is_number_integer() || !tok_.isValidId(t.get<int32_t>()) ||
            t.get<int64_t>() != t.get<int32_t>()) {
          ok = false;
          break;
        }
        ids.push_back(t.get<int32_t>());
      }
    if (!ok)
      return sendError(res, 400,
                       fmt::format("'tokens' must be a list of ids in [0, {})",
                                   tok_.vocabSize()),
                       "invalid_request_error", "tokens");
    Expected<std::string> text = tok_.decode(ids);
    if (!text)
      return sendError(res, 400, text.error().message(),
                       "invalid_request_error", "tokens");
    res.set_content(dump({{"prompt", *text}}), "application/json");
  });
  http.Post("/v1/completions",
            [this](const httplib::Request &req, httplib::Response &res) {
              completions(req, res, /*chat=*/false);
            });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request &req, httplib::Response &res) {
              completions(req, res, /*chat=*/true);
            });
  http.set_error_handler([](const httplib::Request &req,
                            httplib::Response &res) {
    if (res.status == 404 && res.body.empty())
      sendError(res, 404,
                fmt::format("no route {} {}", req.method, req.path),
                "invalid_request_error");
    else if (res.status == 413 && res.body.empty())
      sendError(res, 413,
                "the request body is larger than this server takes "
                "(kiln-serve --max-request-bytes)",
                "invalid_request_error");
  });
  http.set_exception_handler([](const httplib::Request &, httplib::Response &res,
                                std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception &e) {
      what = e.what();
    } catch (...) {
    }
    sendError(res, 500, what, "server_error");
  });
}

httplib::Server *gServer = nullptr;
void stopOnSignal(int) {
  if (gServer)
    gServer->stop();
}

} // namespace

int main(int argc, char **argv) {
  SessionOptions options;
  std::string host = "127.0.0.1", modelName;
  int port = 8080;
  uint64_t maxContext = 0;
  uint64_t maxRequestBytes = uint64_t(64) << 20;
  std::string chatTemplate;
  bool separateReasoning = true;
  std::string apiKey;
  if (const char *env = std::getenv("KILN_API_KEY"))
    apiKey = env;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char *flag) -> std::string {
      if (i + 1 >= argc) {
        usageError(std::string(flag) + " needs a value");
        std::exit(2);
      }
      return argv[++i];
    };
    auto integer = [&](const char *flag, uint64_t low, uint64_t high) {
      uint64_t x = 0;
      if (!parseUnsigned(value(flag).c_str(), low, high, x)) {
        usageError(fmt::format("{}: expected a number in [{}, {}]", flag, low,
                               high));
        std::exit(2);
      }
      return x;
    };
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--host") {
      host = value("--host");
    } else if (arg == "--port") {
      port = int(integer("--port", 0, 65535));
    } else if (arg == "--model-name") {
      modelName = value("--model-name");
    } else if (arg == "--max-context") {
      maxContext = integer("--max-context", 1, uint64_t(1) << 31);
    } else if (arg == "--max-request-bytes") {
      maxRequestBytes = integer("--max-request-bytes", 1, uint64_t(1) << 40);
    } else if (arg == "--chat-template") {
      chatTemplate = value("--chat-template");
    } else if (arg == "--api-key") {
      apiKey = value("--api-key");
      if (apiKey.empty())
        return usageError("--api-key: expected a non-empty key");
    } else if (arg == "--reasoning") {
      std::string mode = value("--reasoning");
      if (mode != "separate" && mode != "inline")
        return usageError("--reasoning: expected separate or inline, not '" +
                          mode + "'");
      separateReasoning = mode == "separate";
    } else if (std::string error;
               !parseSessionFlag(argc, argv, i, options, error)) {
      return usageError(error);
    }
  }
  if (options.artifactPath.empty())
    return usageError("no artifact given");
  auto fail = [](const Error &e) {
    std::fprintf(stderr, "kiln-serve: error: %s\n", e.message().c_str());
    return 1;
  };
  // The tokenizer and the chat template (the file's, else GLM's format).
  Expected<TextModel> model = openTextModel(options, chatTemplate);
  if (!model)
    return fail(model.error());
  Session &s = *model->session;
  if (modelName.empty()) {
    modelName = "kiln";
    if (const gguf::Value *v = s.model().find("general.name");
        v && v->asString() && !v->asString()->empty())
      modelName = *v->asString();
  }
  if (maxContext == 0 || maxContext > s.contextLength())
    maxContext = s.contextLength();

  httplib::Server http;
  Server server(s, std::move(model->tokenizer),
                std::move(model->chat.chatTemplate), modelName, maxContext,
                separateReasoning);
  server.install(http, apiKey);
  // cpp-httplib reads any body length by default; a larger one is a 413
  // (the error handler gives it the JSON shape).
  http.set_payload_max_length(size_t(maxRequestBytes));
  int bound = port == 0 ? http.bind_to_any_port(host) : port;
  if (port != 0 && !http.bind_to_port(host, port))
    return fail(Error(fmt::format("{}:{}", host, port), "",
                      "cannot listen there (in use, or not an address of "
                      "this machine)"));
  if (bound < 0)
    return fail(Error(host, "", "cannot listen on any port"));
  gServer = &http;
  std::signal(SIGINT, stopOnSignal);
  std::signal(SIGTERM, stopOnSignal);
  std::printf("kiln-serve: serving '%s' on http://%s:%d (backend %s, context "
              "%llu%s)\n",
              modelName.c_str(), host.c_str(), bound,
              s.artifact().target.c_str(), (unsigned long long)maxContext,
              apiKey.empty() ? "" : ", API key required");
  std::fflush(stdout);
  if (!http.listen_after_bind())
    return fail(Error(host, "", "the server stopped with an error"));
  return 0;
}
