//===- TemplateAst.h - Parsed form of a chat template -----------*- C++ -*-===//
//
// Internal to runtime/chat: what ChatTemplate.cpp's parser builds and
// Render.cpp walks. Every node keeps its byte offset in the (newline-
// normalized) template source, so that errors can name line and column.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CHAT_TEMPLATEAST_H
#define KILN_CHAT_TEMPLATEAST_H

#include "chat/ChatTemplate.h"
#include "chat/Value.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::chat::detail {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Literal,   // literal
  Name,      // name
  List,      // operands: items
  Tuple,     // operands: items
  Dict,      // operands: key, value, key, value, ...
  Attr,      // operands[0] . name
  Item,      // operands[0] [ operands[1] ]
  Slice,     // operands[0] [ operands[1] : operands[2] : operands[3] ] (null:
             // absent)
  Call,      // global function `name`(args)
  MacroCall, // a macro `name`(args): positional, then keyword (Arg::name)
  Namespace, // namespace(args): an optional dict, then keyword attributes
  Method,    // operands[0] . name (args)
  Filter,    // operands[0] | name (args)
  Test,      // operands[0] is [not] name (args)
  Not,       // not operands[0]
  Neg,       // - operands[0]
  Pos,       // + operands[0]
  Binary,    // operands[0] name operands[1]; name is + - * / // % ** ~
  Compare,   // operands[0] ops[0] operands[1] ops[1] operands[2] ...
  And,       // operands[0] and operands[1]
  Or,        // operands[0] or operands[1]
  Cond,      // operands[0] if operands[1] else operands[2] (null: no else)
};

/// A call argument: positional when `name` is empty.
struct Arg {
  std::string name;
  ExprPtr value;
};

struct Expr {
  ExprKind kind;
  size_t offset = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> operands;
  std::vector<Arg> args;
  std::vector<std::string> ops; // Compare: == != < <= > >= in notin
  bool negated = false;         // Test: `is not`
  uint32_t height = 1;          // 1 + the tallest child (bounded by the parser)
};

enum class NodeKind { Text, Output, If, For, Set, Break, Continue, Macro };

struct Node;
using Body = std::vector<Node>;

/// One `if`/`elif` branch, or the `else` branch (no condition).
struct IfBranch {
  ExprPtr condition;
  Body body;
};

struct Node {
  NodeKind kind;
  size_t offset = 0;
  std::string text;                 // Text; Macro: its name
  ExprPtr expr;                     // Output; Set value; For iterable
  std::vector<std::string> targets; // For, Set: the names assigned; Macro:
                                    // its parameters
  std::string attribute;            // Set ns.attribute = ...
  std::vector<ExprPtr> defaults;    // Macro: each parameter's (null: none)
  bool unpack = false;              // targets written as a tuple (a, b)
  ExprPtr filter;                   // For ... if filter
  std::vector<IfBranch> branches;   // If
  Body body;                        // For, Macro
  Body elseBody;                    // For ... else
};

/// A parsed template: the normalized source (for positions) and its body.
struct TemplateImpl {
  std::string where;
  std::string source;
  TemplateOptions options;
  Body body;

  /// "line L, column C" (1-based; the column counts code points).
  std::string position(size_t offset) const;
};

/// Renders a parsed template (Render.cpp).
Expected<std::string> renderTemplate(const TemplateImpl &impl,
                                     const Value &context,
                                     const RenderLimits &limits);

/// The parameters of a supported filter, test, method or global function
/// (for filters and tests, after the value they apply to). The parser
/// checks calls against it and stores the arguments in this order, absent
/// ones as null, so the renderer reads them by index.
struct Signature {
  std::string_view name;
  std::vector<std::string_view> params;
  size_t required = 0;
};

/// The supported ones; null when `name` is not (Render.cpp). Aliases
/// (`count`, `d`) resolve to their canonical signature.
const Signature *findFilter(std::string_view name);
const Signature *findTest(std::string_view name);
const Signature *findMethod(std::string_view name);
const Signature *findFunction(std::string_view name);

} // namespace kiln::chat::detail

#endif // KILN_CHAT_TEMPLATEAST_H
