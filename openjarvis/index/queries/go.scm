; Definitions and references for Go.
(function_declaration name: (identifier) @name) @definition.function
(method_declaration name: (field_identifier) @name) @definition.method
(type_declaration (type_spec name: (type_identifier) @name type: (struct_type)) @definition.struct)
(type_declaration (type_spec name: (type_identifier) @name type: (interface_type)) @definition.interface)
(type_declaration (type_spec name: (type_identifier) @name type: [(type_identifier) (qualified_type) (function_type) (map_type) (slice_type) (pointer_type) (channel_type) (generic_type)]) @definition.type)
(method_elem name: (field_identifier) @name) @definition.method
(source_file (const_declaration (const_spec name: (identifier) @name) @definition.constant))
(source_file (var_declaration (var_spec name: (identifier) @name) @definition.constant))
(call_expression function: (identifier) @reference.call)
(call_expression function: (selector_expression field: (field_identifier) @reference.call))
(import_spec path: (interpreted_string_literal) @reference.import)
(type_identifier) @reference.type
