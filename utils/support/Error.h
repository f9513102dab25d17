//===- Error.h - Errors as values for Kiln's MLIR-free code ----*- C++ -*-===//
//
// Every failure the MLIR-free half reports names where it happened (a file,
// an artifact, a flag), the field concerned (a metadata key, a tensor name)
// and the problem, and travels up to the command line as a value. Nothing
// here throws, so these types are safe to use next to LLVM code built
// without exceptions.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_SUPPORT_ERROR_H
#define KILN_SUPPORT_ERROR_H

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

/// A failure: where it happened, which field, and what is wrong.
/// `message()` renders it as "where: field: problem" (empty parts omitted).
class Error {
public:
  Error(std::string where, std::string field, std::string problem)
      : where_(std::move(where)), field_(std::move(field)),
        problem_(std::move(problem)) {}

  const std::string &where() const { return where_; }
  const std::string &field() const { return field_; }
  const std::string &problem() const { return problem_; }

  /// One line, suitable for "tool: error: <message>".
  std::string message() const;

  /// The same error with another outer location, e.g. the split part that
  /// a reader error came from.
  Error withWhere(std::string where) const {
    return Error(std::move(where), field_, problem_);
  }

private:
  std::string where_;
  std::string field_;
  std::string problem_;
};

/// Success, or an Error.
class [[nodiscard]] Status {
public:
  static Status ok() { return Status(); }
  Status(Error error) : error_(std::move(error)) {}

  bool isOk() const { return !error_.has_value(); }
  explicit operator bool() const { return isOk(); }
  const Error &error() const {
    assert(error_ && "error() on an ok Status");
    return *error_;
  }

private:
  Status() = default;
  std::optional<Error> error_;
};

/// A value of type T, or an Error.
template <typename T> class [[nodiscard]] Expected {
public:
  Expected(T value) : storage_(std::in_place_index<0>, std::move(value)) {}
  Expected(Error error) : storage_(std::in_place_index<1>, std::move(error)) {}

  bool hasValue() const { return storage_.index() == 0; }
  explicit operator bool() const { return hasValue(); }

  T &operator*() {
    assert(hasValue() && "dereferencing an Expected that holds an error");
    return std::get<0>(storage_);
  }
  const T &operator*() const {
    assert(hasValue() && "dereferencing an Expected that holds an error");
    return std::get<0>(storage_);
  }
  T *operator->() { return &**this; }
  const T *operator->() const { return &**this; }

  const Error &error() const {
    assert(!hasValue() && "error() on an Expected that holds a value");
    return std::get<1>(storage_);
  }
  /// The error as a Status, for functions that return Status.
  Status status() const { return hasValue() ? Status::ok() : Status(error()); }

private:
  std::variant<T, Error> storage_;
};

} // namespace kiln

#endif // KILN_SUPPORT_ERROR_H
