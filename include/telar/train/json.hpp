#pragma once
/*! \file
 *  \brief A small JSON object writer for machine-readable run summaries. */
#include <cmath>
#include <cstdio>
#include <string>

namespace telar {

/*! \brief Builds one JSON object, member by member, in insertion order.
 *  \code
 *  telar::JsonObject j;
 *  j.add("final_loss", 0.31).add("strategy", "serial").add("config", other_object);
 *  std::puts(j.str().c_str());   // {"final_loss":0.31,"strategy":"serial","config":{...}}
 *  \endcode */
class JsonObject {
public:
  /*! \brief Adds a string member. \param key name \param value text */
  JsonObject& add(std::string const& key, std::string const& value) {
    return raw(key, quote(value));
  }
  /*! \brief Adds a string member. \param key name \param value text */
  JsonObject& add(std::string const& key, char const* value) { return raw(key, quote(value)); }
  /*! \brief Adds a number (NaN and infinities become null). \param key name \param value number */
  JsonObject& add(std::string const& key, double value) {
    if (!std::isfinite(value))
      return raw(key, "null");
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.10g", value);
    return raw(key, buf);
  }
  /*! \brief Adds an integer. \param key name \param value number */
  JsonObject& add(std::string const& key, long long value) {
    return raw(key, std::to_string(value));
  }
  /*! \brief Adds an integer. \param key name \param value number */
  JsonObject& add(std::string const& key, int value) { return raw(key, std::to_string(value)); }
  /*! \brief Adds a boolean. \param key name \param value flag */
  JsonObject& add(std::string const& key, bool value) { return raw(key, value ? "true" : "false"); }
  /*! \brief Adds a nested object. \param key name \param value object */
  JsonObject& add(std::string const& key, JsonObject const& value) { return raw(key, value.str()); }
  /*! \brief Adds already-encoded JSON. \param key name \param json encoded value */
  JsonObject& raw(std::string const& key, std::string const& json) {
    body_ += (body_.empty() ? "" : ",") + quote(key) + ":" + json;
    return *this;
  }
  /*! \brief The encoded object. */
  std::string str() const { return "{" + body_ + "}"; }

  /*! \brief A JSON string literal for \p s. \param s text */
  static std::string quote(std::string const& s) {
    std::string out = "\"";
    for (char c : s) {
      char const* const escaped = c == '"'    ? "\\\""
                                  : c == '\\' ? "\\\\"
                                  : c == '\n' ? "\\n"
                                  : c == '\t' ? "\\t"
                                              : nullptr;
      if (escaped != nullptr) {
        out += escaped;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      } else {
        out += c;
      }
    }
    return out + "\"";
  }

private:
  std::string body_;
};

} // namespace telar
