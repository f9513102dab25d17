//===- Error.cpp - Rendering of Kiln errors --------------------------------===//
#include "support/Error.h"

namespace kiln {

std::string Error::message() const {
  std::string out;
  for (const std::string *part : {&where_, &field_, &problem_}) {
    if (part->empty())
      continue;
    if (!out.empty())
      out += ": ";
    out += *part;
  }
  return out.empty() ? std::string("unknown error") : out;
}

} // namespace kiln
