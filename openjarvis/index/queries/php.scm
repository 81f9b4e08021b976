; Definitions and references for PHP.
(class_declaration name: (name) @name) @definition.class
(interface_declaration name: (name) @name) @definition.interface
(trait_declaration name: (name) @name) @definition.interface
(enum_declaration name: (name) @name) @definition.enum
(function_definition name: (name) @name) @definition.function
(method_declaration name: (name) @name) @definition.method
(const_declaration (const_element (name) @name)) @definition.constant
(function_call_expression function: (name) @reference.call)
(member_call_expression name: (name) @reference.call)
(scoped_call_expression name: (name) @reference.call)
(object_creation_expression (name) @reference.type)
(namespace_use_clause (qualified_name (name) @reference.import))
(base_clause (name) @reference.type)
