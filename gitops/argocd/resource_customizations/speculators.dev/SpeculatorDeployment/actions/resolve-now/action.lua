-- Ask the operator to resolve the verifier and draft revisions now (once per value).
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["speculators.dev/resolve-requested"] = os.date("!%Y-%m-%dT%XZ")
return obj
